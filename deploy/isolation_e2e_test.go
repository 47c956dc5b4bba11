//go:build e2e

package deploy

import (
	"context"
	"maps"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
)

// isolationTarget is one address a probe in an executor Pod connects to.
type isolationTarget struct {
	label, addr string
	// denied: the shipped policies must refuse it; else they must let it through.
	denied bool
}

// TestE2EClusterIsolation enforces the shipped NetworkPolicies
// (deploy/base/07-network-policies.yaml, applied by installKEDA with the
// whole of deploy/keda) with a real dataplane, kube-router's network policy
// controller on the node (clusterenv.StartNetworkPolicy), and checks what an
// executor Pod reaches: a probe Pod with the labels the pod backend gives
// its executors, in the executors' namespace, connects every second to NATS,
// the API server (the "kubernetes" Service and the node's address), the
// kubelet, the SPIRE server, the gateway's metrics port and another executor
// Pod (all refused), and to the gateway's 8443, directly and through its
// Service (answers). A real job then runs to success, its executor under
// the same policies, and the gateway stays Ready and alive meanwhile: its
// kubelet probes get through. Then, with the policies deleted, the same
// connections all succeed: the refusals were the policies'.
//
// Each phase first waits until kube-router's rules for the probe, the
// other executor and the gateway run through exactly the policies that
// select them (none, once deleted), then reads the first round of the
// probe that started after that.
func TestE2EClusterIsolation(t *testing.T) {
	clusterenv.KubeRouterAssets(t) // before the install: skip (or fail, CI=true) at once
	ctx, cancel := clusterTest(t, 15*time.Minute)
	defer cancel()
	// The probes reach the gateway between jobs: it stays up.
	in := installKEDAWith(ctx, t, installOptions{alwaysUp: true})
	np := in.c.StartNetworkPolicy(ctx, t)

	// The labels of a real executor Pod: the pod backend's, for the shipped pool.
	docs := buildKustomization(t, "keda")
	executorLabels := executorPod(t, docs).Labels
	if executorLabels["gitea-dynamic-runner.io/runner"] != "true" {
		t.Fatalf("executor labels %v lack gitea-dynamic-runner.io/runner=true", executorLabels)
	}
	policies := loadPolicies(t, docs)
	selecting := func(p *corev1.Pod) []string { return policies.selecting(t, p) }

	probeImage, err := clusterenv.BuildImage(ctx, t, "probe", "./internal/testenv/clusterenv/testdata/probe")
	if err == nil {
		err = in.c.ImportImage(ctx, probeImage, "gdr.local/probe")
	}
	if err != nil {
		t.Fatal(err)
	}
	// Another executor Pod, with a listener (the echo service of the install test's jobs).
	other := in.runPod(ctx, t, executorLike(executorLabels, "isolation-other-executor", echoContainer()))
	gateway := in.gatewayPod(ctx, t)

	natsURL, err := url.Parse(in.nats.url)
	if err != nil {
		t.Fatal(err)
	}
	apiURL, err := url.Parse(in.c.Plane.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	node := in.c.NodeIP()
	targets := []isolationTarget{
		{"nats", net.JoinHostPort(node, natsURL.Port()), true}, // Forward keeps the port
		{"api-service", "10.0.0.1:443", true},                  // the "kubernetes" Service
		{"api-node", net.JoinHostPort(node, apiURL.Port()), true},
		{"kubelet", net.JoinHostPort(node, "10250"), true},
		{"spire-server", in.spireServerAddr(ctx, t), true},
		{"gateway-metrics", net.JoinHostPort(gateway.Status.PodIP, "9090"), true},
		{"other-executor", net.JoinHostPort(other.Status.PodIP, "7000"), true},
		{"gateway", net.JoinHostPort(gateway.Status.PodIP, "8443"), false},
		{"gateway-service", net.JoinHostPort(gatewayClusterIP, "443"), false},
	}
	args := []string{"every=1s"}
	for _, tg := range targets {
		args = append(args, "connect="+tg.label+"@"+tg.addr)
	}
	probe := in.runPod(ctx, t, executorLike(executorLabels, "isolation-probe", corev1.Container{
		Name: "probe", Image: "gdr.local/probe:latest", ImagePullPolicy: corev1.PullIfNotPresent, Args: args,
	}))
	t.Logf("probe %s (%s) -> %v", probe.Name, probe.Status.PodIP, targets)

	// Enforced: the condition first (the rules of every Pod concerned run
	// through the policies that select it), then the outcome.
	var enforced time.Time
	for _, p := range []*corev1.Pod{probe, other, gateway} {
		want := selecting(p)
		at := np.WaitPodPolicies(ctx, t, p.Namespace, p.Name, want, 2*time.Minute)
		t.Logf("kube-router: Pod %s runs through %v", p.Name, want)
		enforced = later(enforced, at)
	}
	round := in.probeRound(ctx, t, probe.Name, enforced)
	for _, tg := range targets {
		got := round[tg.label]
		if tg.denied && got == "ok" {
			t.Errorf("policies enforced: an executor Pod reached %s (%s)", tg.label, tg.addr)
		}
		if !tg.denied && got != "ok" {
			t.Errorf("policies enforced: an executor Pod did not reach %s (%s): %s", tg.label, tg.addr, got)
		}
	}
	t.Logf("policies enforced: %v", round)
	// A real job runs to success under the enforced policies: its executor
	// gets its SVID and reports through the gateway (SPIFFE mTLS, 8443).
	// Whether Gitea's webhook reaches dispatch (a NodePort, from this
	// machine) does not matter: dispatch also finds jobs by polling Gitea.
	repo := in.g.CreateRepo(t, "isolated")
	pushed := time.Now()
	in.g.PushWorkflow(t, repo, ".gitea/workflows/isolated.yml", `on: push
jobs:
  isolated:
    runs-on: ubuntu-latest
    steps:
      - run: echo "isolated in $(cat /etc/hostname)"
`)
	if job := in.waitCompleted(ctx, t, repo, "isolated", 5*time.Minute); job.Conclusion != "success" {
		t.Errorf("job under the enforced policies: %+v, want success; log:\n%s", job, in.g.JobLogs(t, repo, job.ID))
	} else if log := in.g.JobLogs(t, repo, job.ID); !strings.Contains(log, "isolated in gdr-linux-") {
		t.Errorf("job isolated's log lacks its step's output:\n%s", log)
	} else {
		t.Logf("job isolated: success under the enforced policies, %v after the push", time.Since(pushed).Round(time.Millisecond))
	}
	// The gateway's kubelet probes (readiness every 10 s, failing after 3)
	// must get through: it stays Ready, its liveness never fails.
	restarts := gateway.Status.ContainerStatuses[0].RestartCount
	for time.Since(enforced) < 35*time.Second {
		time.Sleep(time.Second)
	}
	g, err := in.cs.CoreV1().Pods(gateway.Namespace).Get(ctx, gateway.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !podReady(g) || g.Status.ContainerStatuses[0].RestartCount != restarts {
		t.Errorf("gateway %s under the enforced policies: ready=%v, restarts %d -> %d; want ready, no restart",
			g.Name, podReady(g), restarts, g.Status.ContainerStatuses[0].RestartCount)
	}
	if t.Failed() {
		in.c.DumpLogs(t)
		t.FailNow()
	}

	// Removed: every NetworkPolicy of both namespaces deleted; the condition
	// (no rule of a policy left for those Pods), then the same probes.
	for _, ns := range []string{installNamespace, jobsNamespace} {
		if err := in.cs.NetworkingV1().NetworkPolicies(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var removed time.Time
	for _, p := range []*corev1.Pod{probe, other, gateway} {
		removed = later(removed, np.WaitPodPolicies(ctx, t, p.Namespace, p.Name, nil, 2*time.Minute))
	}
	round = in.probeRound(ctx, t, probe.Name, removed)
	for _, tg := range targets {
		if got := round[tg.label]; got != "ok" {
			t.Errorf("policies removed: an executor Pod did not reach %s (%s): %s", tg.label, tg.addr, got)
		}
	}
	t.Logf("policies removed: %v", round)
}

// selecting returns the names of the policies of ps that select the Pod p; it fails t if none
// does (every Pod of the install is selected by a shipped policy).
func (ps policySet) selecting(t *testing.T, p *corev1.Pod) []string {
	t.Helper()
	var names []string
	for _, pol := range ps {
		if pol.Namespace == p.Namespace && selects(t, &pol.Spec.PodSelector, p.Labels) {
			names = append(names, pol.Name)
		}
	}
	if len(names) == 0 {
		t.Fatalf("no shipped NetworkPolicy selects Pod %s/%s (labels %v)", p.Namespace, p.Name, p.Labels)
	}
	return names
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// executorLike is a Pod named name in the executors' namespace with the labels the pod backend
// gives its executors (executorLabels, with an assignment ID of its own) and containers, hardened
// as an executor is (the namespace enforces Pod Security restricted, or the admission policy).
func executorLike(executorLabels map[string]string, name string, containers ...corev1.Container) *corev1.Pod {
	labels := maps.Clone(executorLabels)
	labels["gitea-dynamic-runner.io/assignment-id"] = name // one per Pod, as the backend's
	for i := range containers {
		containers[i].SecurityContext = &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: containers,
		},
	}
}

// echoContainer serves the echo service (the install test's jobs' service) on 7000.
func echoContainer() corev1.Container {
	return corev1.Container{
		Name: "echo", Image: "gdr.local/echo:latest", ImagePullPolicy: corev1.PullIfNotPresent,
		Ports: []corev1.ContainerPort{{ContainerPort: 7000}},
	}
}

// runPod creates pod (an executor's stand-in) in the executors' namespace and
// returns it once it runs with an address.
func (in *installation) runPod(ctx context.Context, t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if _, err := in.cs.CoreV1().Pods(jobsNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Pod %s: %v", pod.Name, err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		p, err := in.cs.CoreV1().Pods(jobsNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded || time.Now().After(deadline) {
			dumpPods(ctx, t, in.cs)
			t.Fatalf("Pod %s: %s, want Running", p.Name, p.Status.Phase)
		}
	}
}

// gatewayPod returns the running, Ready gateway Pod (one replica here).
func (in *installation) gatewayPod(ctx context.Context, t *testing.T) *corev1.Pod {
	t.Helper()
	pods, err := in.cs.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gateway"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && podReady(p) && p.Status.PodIP != "" {
			return p
		}
	}
	t.Fatalf("no Ready gateway Pod among %d", len(pods.Items))
	return nil
}

// spireServerAddr is where the node's SPIRE agent reaches the SPIRE server
// (the address clusterenv forwards it at), read from the agent's
// configuration in the cluster.
func (in *installation) spireServerAddr(ctx context.Context, t *testing.T) string {
	t.Helper()
	cm, err := in.cs.CoreV1().ConfigMaps("spire").Get(ctx, "spire-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conf := cm.Data["agent.conf"]
	host := regexp.MustCompile(`server_address = "([^"]+)"`).FindStringSubmatch(conf)
	port := regexp.MustCompile(`server_port = "([^"]+)"`).FindStringSubmatch(conf)
	if host == nil || port == nil {
		t.Fatalf("no server_address or server_port in the SPIRE agent's configuration:\n%s", conf)
	}
	return net.JoinHostPort(host[1], port[1])
}

// probeRound returns the results (label -> "ok" or "fail:<reason>") of the
// first complete round the probe Pod name started after since.
func (in *installation) probeRound(ctx context.Context, t *testing.T, name string, since time.Time) map[string]string {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		raw, err := in.cs.CoreV1().Pods(jobsNamespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("probe %s's log: %v", name, err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "round" {
				continue
			}
			ns, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || !time.Unix(0, ns).After(since) {
				continue
			}
			out := map[string]string{}
			for _, r := range f[2:] {
				label, result, _ := strings.Cut(r, "=")
				out[label] = result
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe %s: no round started after %v; log tail:\n%s", name, since.Format(time.RFC3339Nano), tail(string(raw), 5))
		}
	}
}
