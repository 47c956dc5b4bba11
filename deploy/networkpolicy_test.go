package deploy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// installNamespace is the control plane's namespace, the one the manifests are applied to
// (deploy/README.md).
const installNamespace = "gitea-dynamic-runner"

// jobsNamespace is the executors' namespace (GDR_KUBE_NAMESPACE of base/00-config.yaml).
const jobsNamespace = installNamespace + "-jobs"

// noEntries is the SPIRE entry client pod.New requires. An executor whose Pod is not
// scheduled never reaches SPIRE, so no call is expected.
type noEntries struct{}

var errNoSPIRE = errors.New("no SPIRE in this test")

func (noEntries) BatchCreateEntry(context.Context, *entryv1.BatchCreateEntryRequest, ...grpc.CallOption) (*entryv1.BatchCreateEntryResponse, error) {
	return nil, errNoSPIRE
}
func (noEntries) GetEntry(context.Context, *entryv1.GetEntryRequest, ...grpc.CallOption) (*spiretypes.Entry, error) {
	return nil, errNoSPIRE
}
func (noEntries) BatchDeleteEntry(context.Context, *entryv1.BatchDeleteEntryRequest, ...grpc.CallOption) (*entryv1.BatchDeleteEntryResponse, error) {
	return nil, errNoSPIRE
}

// fixedEnvironment stands in for the bootstrap: the Pod's labels do not depend on it.
type fixedEnvironment struct{}

func (fixedEnvironment) Environment(a taskassignment.Assignment) (map[string]string, error) {
	return map[string]string{"CI_ASSIGNMENT_ID": a.ID}, nil
}

// shippedPodConfig is the pod backend's configuration from the shipped gdr-config and gdr-pools
// ConfigMaps of docs, without client, namespace and SPIRE entry client; its Minter, as
// GDR_POD_IDENTITY says, is a local CA.
func shippedPodConfig(t *testing.T, docs []doc) pod.Config {
	t.Helper()
	cfg := stringMap(path(one(t, docs, "ConfigMap", "gdr-config").obj, "data"))
	naming := taskassignment.NamingSettings{TrustDomain: cfg["GDR_TRUST_DOMAIN"], MetadataPrefix: cfg["GDR_METADATA_PREFIX"]}
	if naming.MetadataPrefix == "" {
		naming.MetadataPrefix = "gitea-dynamic-runner.io" // the variable's default (docs/CONFIGURATION.md)
	}
	td, keys, err := naming.Parse()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := path(one(t, docs, "ConfigMap", "gdr-pools").obj, "data", "pools.yaml").(string)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pools.yaml"), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	pools, err := runnerpool.Load(filepath.Join(dir, "pools.yaml"), dir)
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Config{Keys: keys, TrustDomain: td, Pools: pools, Cluster: cfg["GDR_CLUSTER_NAME"]}
	switch cfg["GDR_POD_IDENTITY"] {
	case "", backend.PodIdentityMinted: // the variable's default
		// handle mints with SPIRE; a local CA here: the Pod does not
		// depend on who signs its SVID.
		ca, err := svidca.New(td)
		if err != nil {
			t.Fatal(err)
		}
		c.Minter = ca
	case backend.PodIdentityWorkloadAPI:
	default:
		t.Fatalf("gdr-config: GDR_POD_IDENTITY %q", cfg["GDR_POD_IDENTITY"])
	}
	return c
}

// executorPod creates, with the real pod backend and worker (what handle runs), the executor
// Pod of an assignment of the shipped pool linux, configured from the shipped gdr-config and
// gdr-pools ConfigMaps, and returns the Pod as the API server received it.
func executorPod(t *testing.T, docs []doc) *corev1.Pod {
	t.Helper()
	return executorPodFor(t, docs, taskassignment.Task{ID: 42, Pool: "linux"})
}

// executorPodFor is executorPod for task (its container image and services).
func executorPodFor(t *testing.T, docs []doc, task taskassignment.Task) *corev1.Pod {
	t.Helper()
	cfg := shippedPodConfig(t, docs)
	td, keys := cfg.TrustDomain, cfg.Keys
	client := fake.NewClientset()
	ns := stringMap(path(one(t, docs, "ConfigMap", "gdr-config").obj, "data"))["GDR_KUBE_NAMESPACE"]
	if ns == "" {
		t.Fatal("gdr-config: no GDR_KUBE_NAMESPACE, the executors' namespace")
	}
	cfg.Client, cfg.Namespace, cfg.Entries = client, ns, noEntries{}
	backend, err := pod.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	id, err := taskidentity.New(td, "owner/repo", "build", 42)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendPod, task, id)
	if err != nil {
		t.Fatal(err)
	}
	w := executor.Worker{Backend: backend, Bootstrap: fixedEnvironment{}, Keys: keys}
	if _, err := w.Accept(context.Background(), a); err != nil {
		t.Fatalf("Accept: %v", err)
	}
	list, err := client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("executor Pods: %v, %v", list, err)
	}
	return &list.Items[0]
}

// endpoint is one end of a connection in the model cluster: a Pod (labels set) or an address.
type endpoint struct {
	name      string
	namespace string            // of a Pod
	labels    map[string]string // nil: not a Pod
	ip        netip.Addr
	ports     map[string]int32 // named container ports of a Pod
}

// namespaceLabels are the labels of the model cluster's namespaces (the API server sets
// kubernetes.io/metadata.name on each).
func namespaceLabels(ns string) map[string]string {
	return map[string]string{"kubernetes.io/metadata.name": ns}
}

// policySet evaluates NetworkPolicies the way the API defines them: a Pod selected by a policy
// of a direction is isolated in that direction and reachable only as some selecting policy's
// rule allows; rules of all policies add up. ipBlock is matched against every address, Pod
// addresses included (CNIs differ there; matching is the stricter reading for "denied").
type policySet []networkingv1.NetworkPolicy

func selects(t *testing.T, sel *metav1.LabelSelector, set map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	return s.Matches(labels.Set(set))
}

func (ps policySet) peerMatches(t *testing.T, policyNS string, peer networkingv1.NetworkPolicyPeer, e endpoint) bool {
	if peer.IPBlock != nil {
		cidr := netip.MustParsePrefix(peer.IPBlock.CIDR)
		if !cidr.Contains(e.ip) {
			return false
		}
		for _, ex := range peer.IPBlock.Except {
			if netip.MustParsePrefix(ex).Contains(e.ip) {
				return false
			}
		}
		return true
	}
	if e.labels == nil {
		return false // selectors select Pods only
	}
	if peer.NamespaceSelector != nil {
		if !selects(t, peer.NamespaceSelector, namespaceLabels(e.namespace)) {
			return false
		}
	} else if e.namespace != policyNS {
		return false
	}
	return peer.PodSelector == nil || selects(t, peer.PodSelector, e.labels)
}

func portMatches(ports []networkingv1.NetworkPolicyPort, dst endpoint, port int32, proto corev1.Protocol) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		pp := corev1.ProtocolTCP
		if p.Protocol != nil {
			pp = *p.Protocol
		}
		if pp != proto {
			continue
		}
		if p.Port == nil {
			return true
		}
		want := p.Port.IntVal
		if p.Port.StrVal != "" {
			named, ok := dst.ports[p.Port.StrVal]
			if !ok {
				continue
			}
			want = named
		}
		if port == want || (p.EndPort != nil && port >= want && port <= *p.EndPort) {
			return true
		}
	}
	return false
}

func hasType(p networkingv1.NetworkPolicy, ty networkingv1.PolicyType) bool {
	if len(p.Spec.PolicyTypes) == 0 { // the API's defaulting
		return ty == networkingv1.PolicyTypeIngress || (ty == networkingv1.PolicyTypeEgress && len(p.Spec.Egress) > 0)
	}
	return slices.Contains(p.Spec.PolicyTypes, ty)
}

// allowed reports whether src may open a connection to dst on port/proto: egress of src (if a
// Pod) and ingress of dst (if a Pod) must both allow it.
func (ps policySet) allowed(t *testing.T, src, dst endpoint, port int32, proto corev1.Protocol) bool {
	t.Helper()
	if src.labels != nil && !ps.direction(t, src, dst, port, proto, networkingv1.PolicyTypeEgress) {
		return false
	}
	if dst.labels != nil && !ps.direction(t, dst, src, port, proto, networkingv1.PolicyTypeIngress) {
		return false
	}
	return true
}

// direction evaluates one side: pod's policies of type ty, other the remote end.
func (ps policySet) direction(t *testing.T, pod, other endpoint, port int32, proto corev1.Protocol, ty networkingv1.PolicyType) bool {
	isolated := false
	for _, p := range ps {
		if p.Namespace != pod.namespace || !hasType(p, ty) || !selects(t, &p.Spec.PodSelector, pod.labels) {
			continue
		}
		isolated = true
		if ty == networkingv1.PolicyTypeEgress {
			for _, r := range p.Spec.Egress {
				if ps.ruleMatches(t, p.Namespace, r.To, other) && portMatches(r.Ports, other, port, proto) {
					return true
				}
			}
		} else {
			for _, r := range p.Spec.Ingress {
				if ps.ruleMatches(t, p.Namespace, r.From, other) && portMatches(r.Ports, pod, port, proto) {
					return true
				}
			}
		}
	}
	return !isolated
}

func (ps policySet) ruleMatches(t *testing.T, ns string, peers []networkingv1.NetworkPolicyPeer, e endpoint) bool {
	if len(peers) == 0 {
		return true
	}
	return slices.ContainsFunc(peers, func(p networkingv1.NetworkPolicyPeer) bool { return ps.peerMatches(t, ns, p, e) })
}

// loadPolicies decodes the NetworkPolicies of a built install (buildKustomization), each in the
// namespace the build gave it.
func loadPolicies(t *testing.T, docs []doc) policySet {
	t.Helper()
	var ps policySet
	for _, d := range find(docs, "NetworkPolicy", "") {
		var p networkingv1.NetworkPolicy
		if err := strict(d.raw, &p); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if p.Namespace == "" {
			t.Fatalf("%s: no namespace (a kustomize build sets it)", d)
		}
		ps = append(ps, p)
	}
	return ps
}

// executorEgressExcluded are the ranges every ipBlock of the executors' egress must leave out:
// private, shared (CGNAT, where Alibaba Cloud's metadata 100.100.100.200 lies), link-local
// (the metadata endpoints at 169.254.169.254) and Azure's WireServer.
var executorEgressExcluded = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "168.63.129.16/32"}

// TestNetworkPolicies builds a model cluster: the executor Pod the pod backend really creates,
// in the executors' namespace, the control plane's Pods from the manifests in theirs, NATS,
// DNS, SPIRE, the API server, Knative, Gitea and the internet; then checks who may connect to
// whom under the shipped policies, each in the namespace kustomize puts it in.
func TestNetworkPolicies(t *testing.T) {
	t.Run("keda", func(t *testing.T) { checkNetwork(t, buildKustomization(t, "keda"), false) })
	t.Run("knative", func(t *testing.T) { checkNetwork(t, buildKustomization(t, "knative"), true) })
}

func checkNetwork(t *testing.T, docs []doc, knative bool) {
	ps := loadPolicies(t, docs)
	if len(ps) == 0 {
		t.Fatal("no NetworkPolicy")
	}
	pod := executorPod(t, docs)
	if pod.Namespace != jobsNamespace {
		t.Fatalf("executor Pod %s in namespace %q, want %q", pod.Name, pod.Namespace, jobsNamespace)
	}
	executor := endpoint{name: "executor " + pod.Name, namespace: pod.Namespace, labels: pod.Labels, ip: netip.MustParseAddr("10.244.1.10")}

	// The control plane, from the manifests.
	control := map[string]endpoint{}
	ip := 20
	for _, p := range podTemplates(t, docs) {
		if p.pool != "" {
			continue
		}
		ns, _ := path(p.doc.obj, "metadata", "namespace").(string)
		e := endpoint{name: p.String(), namespace: ns, labels: p.labels, ip: netip.MustParseAddr(fmt.Sprintf("10.244.1.%d", ip)), ports: map[string]int32{}}
		ip++
		for _, c := range p.spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name != "" {
					e.ports[cp.Name] = cp.ContainerPort
				}
			}
		}
		control[p.String()] = e
		// The executor policy must not select any control-plane Pod: it would cut them off.
		for _, pol := range ps {
			if pol.Namespace == e.namespace && selects(t, &pol.Spec.PodSelector, e.labels) && hasType(pol, networkingv1.PolicyTypeEgress) &&
				selects(t, &pol.Spec.PodSelector, executor.labels) {
				t.Errorf("NetworkPolicy %s selects both the executor and %s", pol.Name, e.name)
			}
		}
	}
	byFunction := func(f string) []endpoint {
		var out []endpoint
		for _, e := range control {
			if e.labels["app.kubernetes.io/name"] == f {
				out = append(out, e)
			}
		}
		if len(out) == 0 {
			t.Fatalf("no %s Pod in the model", f)
		}
		return out
	}
	gateway := byFunction("gateway")[0]

	other := func(name, ns string, lbls map[string]string, addr string) endpoint {
		return endpoint{name: name, namespace: ns, labels: lbls, ip: netip.MustParseAddr(addr)}
	}
	dns := other("kube-dns", "kube-system", map[string]string{"k8s-app": "kube-dns"}, "10.244.0.3")
	nats := other("nats", "nats", map[string]string{"app.kubernetes.io/name": "nats"}, "10.244.2.5")
	spire := other("spire-server", "spire", map[string]string{"app.kubernetes.io/name": "server"}, "10.244.2.6")
	gitea := other("gitea", "gitea", map[string]string{"app.kubernetes.io/name": "gitea"}, "10.244.3.7")
	curious := other("another Pod of the namespace", installNamespace, map[string]string{"app": "curious"}, "10.244.1.99")
	prometheus := other("prometheus", "monitoring", map[string]string{"app.kubernetes.io/name": "prometheus"}, "10.244.5.9")
	otherMonitor := other("another Pod of the monitoring namespace", "monitoring", map[string]string{"app": "grafana"}, "10.244.5.10")
	anotherExecutor := executor
	anotherExecutor.ip = netip.MustParseAddr("10.244.1.11")
	// Pods of the executors' namespace that are no executor, and executor-labelled Pods elsewhere.
	jobsCurious := other("another Pod of the executors' namespace", jobsNamespace, map[string]string{"app": "curious"}, "10.244.1.98")
	disguised := other("a Pod labelled as an executor in the control plane's namespace", installNamespace, executor.labels, "10.244.1.97")
	foreign := other("a Pod labelled as an executor in another namespace", "elsewhere", executor.labels, "10.244.6.2")
	address := func(name, addr string) endpoint { return endpoint{name: name, ip: netip.MustParseAddr(addr)} }

	type conn struct {
		src, dst endpoint
		port     int32
		proto    corev1.Protocol
		want     bool
	}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	conns := []conn{
		{executor, gateway, 8443, tcp, true},
		{executor, dns, 53, udp, true},
		{executor, dns, 53, tcp, true},
		{executor, address("the internet (github.com)", "140.82.112.3"), 443, tcp, true},
		{executor, nats, 4222, tcp, false},
		{executor, nats, 8222, tcp, false}, // monitoring
		{executor, address("NATS Service", "10.96.12.34"), 4222, tcp, false},
		{executor, address("Kubernetes API Service", "10.96.0.1"), 443, tcp, false},
		{executor, address("Kubernetes API server", "172.18.0.2"), 6443, tcp, false},
		{executor, address("Kubernetes API server (private)", "192.168.10.2"), 6443, tcp, false},
		{executor, spire, 8081, tcp, false},
		{executor, address("cloud metadata", "169.254.169.254"), 80, tcp, false},
		// The cloud host addresses outside link-local (see the policy's comment).
		{executor, address("Azure's WireServer", "168.63.129.16"), 80, tcp, false},
		{executor, address("Azure's WireServer (host agent port)", "168.63.129.16"), 32526, tcp, false},
		{executor, address("Alibaba Cloud's metadata", "100.100.100.200"), 80, tcp, false},
		{executor, address("CGNAT node", "100.64.0.5"), 10250, tcp, false},
		{executor, gateway, 8080, tcp, false},
		{executor, dns, 8080, tcp, false},
		{executor, anotherExecutor, 8080, tcp, false},
		{curious, gateway, 8443, tcp, false},
		{gitea, gateway, 8443, tcp, false},
		{curious, executor, 22, tcp, false},
		{jobsCurious, gateway, 8443, tcp, false},
		{jobsCurious, dns, 53, udp, false},
		{jobsCurious, address("the internet (github.com)", "140.82.112.3"), 443, tcp, false},
		{jobsCurious, executor, 8080, tcp, false},
		{disguised, gateway, 8443, tcp, false},
		{foreign, gateway, 8443, tcp, false},
		// Metrics: Prometheus scrapes the gateway's plain-HTTP metrics port, and nothing else
		// of the gateway; nobody else reaches that port.
		{prometheus, gateway, 9090, tcp, true},
		{prometheus, gateway, 8443, tcp, false},
		{otherMonitor, gateway, 9090, tcp, false},
		{curious, gateway, 9090, tcp, false},
		{executor, gateway, 9090, tcp, false},
		{gitea, gateway, 9090, tcp, false},
		{prometheus, executor, 9090, tcp, false},
	}
	for _, f := range []string{"handle", "recover"} {
		for _, e := range byFunction(f) {
			conns = append(conns, conn{prometheus, e, 8080, tcp, false})
		}
	}
	for _, f := range []string{"dispatch", "handle", "recover"} {
		for _, e := range byFunction(f) {
			conns = append(conns, conn{executor, e, 8080, tcp, false}, conn{curious, e, 8080, tcp, false},
				conn{executor, e, 8012, tcp, false}) // 8012: Knative's queue-proxy
		}
	}
	for _, e := range byFunction("handle") {
		conns = append(conns, conn{gateway, e, 8080, tcp, false})
	}
	if knative {
		activator := other("activator", "knative-serving", map[string]string{"app": "activator"}, "10.244.4.2")
		pingAdapter := other("pingsource-mt-adapter", "knative-eventing", map[string]string{"eventing.knative.dev/source": "ping-source-controller"}, "10.244.4.3")
		for _, f := range []string{"dispatch", "handle", "recover"} {
			for _, e := range byFunction(f) {
				conns = append(conns, conn{activator, e, 8012, tcp, true}, conn{pingAdapter, e, 8012, tcp, true},
					conn{executor, e, 8012, tcp, false}, conn{gitea, e, 8012, tcp, false})
			}
		}
	} else {
		for _, e := range byFunction("dispatch") {
			if e.ports["http"] != 0 { // the webhook server (serve), not the run CronJob
				conns = append(conns, conn{gitea, e, 8080, tcp, true}, conn{prometheus, e, 8080, tcp, true},
					conn{otherMonitor, e, 8080, tcp, false})
			}
		}
	}
	for _, c := range conns {
		if got := ps.allowed(t, c.src, c.dst, c.port, c.proto); got != c.want {
			verb := "may not"
			if got {
				verb = "may"
			}
			t.Errorf("%s %s connect to %s on %d/%s", c.src.name, verb, c.dst.name, c.port, c.proto)
		}
	}

	// Structurally: every executor egress rule is port-limited to a selected peer, or an
	// ipBlock that leaves out the private, shared and link-local ranges.
	for _, p := range ps {
		if !selects(t, &p.Spec.PodSelector, executor.labels) {
			continue
		}
		for i, r := range p.Spec.Egress {
			for _, peer := range r.To {
				if peer.IPBlock != nil {
					for _, private := range executorEgressExcluded {
						if !slices.Contains(peer.IPBlock.Except, private) {
							t.Errorf("NetworkPolicy %s egress[%d]: ipBlock %s does not leave out %s", p.Name, i, peer.IPBlock.CIDR, private)
						}
					}
				} else if len(r.Ports) == 0 {
					t.Errorf("NetworkPolicy %s egress[%d]: a selected peer on every port", p.Name, i)
				}
				if peer.PodSelector != nil && selects(t, peer.PodSelector, nats.labels) {
					t.Errorf("NetworkPolicy %s egress[%d] selects NATS", p.Name, i)
				}
			}
			for _, port := range r.Ports {
				if port.Port != nil && slices.Contains([]int32{4222, 6222, 7422, 8222}, port.Port.IntVal) {
					t.Errorf("NetworkPolicy %s egress[%d] opens NATS port %d", p.Name, i, port.Port.IntVal)
				}
			}
		}
	}
	if !strings.HasPrefix(executor.name, "executor gdr-linux-42") {
		t.Errorf("executor Pod %s: not the pod backend's name for assignment linux-42", executor.name)
	}
}
