//go:build e2e

package deploy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/release"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/registryenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gateway"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

// helmVersion is the helm CLI scripts/peers/helm.sh builds, the version of Helm's library in
// go.mod.
const helmVersion = "v4.3.2"

// releases is a registry the releases of a test are pushed to, as a user's private registry
// (HTTPS with a CA of its own, which the machine and the node trust; anonymous pulls), reached
// from the machine and the node alike at host.
type releases struct {
	host   string
	caFile string
	dir    string
}

// startReleases starts the registry the test's releases go to.
func startReleases(t testing.TB, c *clusterenv.Cluster) *releases {
	t.Helper()
	reg := registryenv.StartAnonymousTLS(t, net.ParseIP(c.NodeIP()))
	host, err := c.Forward(reg.Addr)
	if err == nil {
		err = c.TrustRegistryCA(host, reg.CAFile)
	}
	if err != nil {
		t.Fatal(err)
	}
	return &releases{host: host, caFile: reg.CAFile, dir: t.TempDir()}
}

// registry is the REGISTRY of the test's releases (README's $REG).
func (r *releases) registry() string { return r.host + "/gdr" }

// publish makes the release version with `make release` from the images `make e2e` built
// (make's -o images: not built again; for this machine's platform alone, the one they hold) and
// pushes it with `make push`, trusting the registry's CA as a user's machine would
// (SSL_CERT_FILE).
func (r *releases) publish(ctx context.Context, t testing.TB, version string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "make", "-C", "..", "-o", "images", "release", "push", "PLATFORMS=linux/"+runtime.GOARCH,
		"VERSION="+version, "REGISTRY="+r.registry(), "RELEASE_DIR="+filepath.Join(r.dir, version))
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+r.caFile)
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make release push %s: %v\n%s", version, err, out)
	}
	t.Logf("make release push %s: %v\n%s", version, time.Since(t0).Round(time.Millisecond), out)
}

// helmShell is the shell deploy/README.md's Helm blocks run in: kubectl and helm (the peers)
// on PATH, the cluster's admin kubeconfig, a HOME of its own (Helm's caches), the release
// registry's CA trusted, and the README's variables.
func (r *releases) helmShell(t testing.TB, c *clusterenv.Cluster, vars map[string]string) *readmeShell {
	t.Helper()
	kubectl := testenv.RequirePeer(t, testenv.Peer{Name: "kubectl", Version: kubectlVersion, Executables: []string{"kubectl"}})
	helm := testenv.RequirePeer(t, testenv.Peer{Name: "helm", Version: helmVersion, Executables: []string{"helm"}})
	vars["REG"] = r.registry()
	return &readmeShell{dir: t.TempDir(), vars: vars, env: []string{
		"PATH=" + kubectl + string(os.PathListSeparator) + helm + string(os.PathListSeparator) + os.Getenv("PATH"),
		"KUBECONFIG=" + c.AdminKubeconfig(), "HOME=" + t.TempDir(), "SSL_CERT_FILE=" + r.caFile,
	}}
}

// helmBlock runs deploy/README.md's Helm block name (readme-test: helm name) with stdin.
func (in *installation) helmBlock(ctx context.Context, t testing.TB, name, stdin string) {
	t.Helper()
	for _, b := range readmePhase(t, "helm") {
		if b.name == name {
			in.helm.run(ctx, t, b, stdin)
			return
		}
	}
	t.Fatalf("README.md has no block readme-test: helm %s", name)
}

// manifest is the release.json of version, published before.
func (r *releases) manifest(t testing.TB, version string) *release.Manifest {
	t.Helper()
	m, err := release.Read(filepath.Join(r.dir, version))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// runRelease checks that every container of the release's Deployments, Jobs and CronJobs
// runs an image of the release m by its reference (tag and digest), and returns how many.
func (in *installation) runRelease(ctx context.Context, t *testing.T, m *release.Manifest) int {
	t.Helper()
	var images []string
	deps, err := in.cs.AppsV1().Deployments(installNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range deps.Items {
		for _, c := range d.Spec.Template.Spec.Containers {
			images = append(images, "Deployment "+d.Name+" "+c.Image)
		}
	}
	crons, err := in.cs.BatchV1().CronJobs(installNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cj := range crons.Items {
		for _, c := range cj.Spec.JobTemplate.Spec.Template.Spec.Containers {
			images = append(images, "CronJob "+cj.Name+" "+c.Image)
		}
	}
	if len(images) < 3 {
		t.Fatalf("only %v", images)
	}
	for _, i := range images {
		_, ref, _ := strings.Cut(i[strings.Index(i, " ")+1:], " ")
		fn := strings.TrimPrefix(strings.Split(filepath.Base(ref), ":")[0], release.ImagePrefix)
		if m.Images[fn] != ref {
			t.Errorf("%s: want %s of release %s", i, m.Images[fn], m.Version)
		}
	}
	return len(images)
}

// gatewayRefuses probes the gateway, while the job of repo runs, as an executor with a stolen or
// made-up identity would: an SVID for the running task from a CA of the same trust domain that
// is not the installation's (forged) fails the TLS handshake; an SVID the installation's CA
// minted for another task (re-targeted), with its own valid capability, may not report the
// running task (PermissionDenied), nor use the running task's capability (Unauthenticated).
// The running job's log must then hold none of the probes' lines.
func (in *installation) gatewayRefuses(ctx context.Context, t *testing.T, repo string) {
	t.Helper()
	var pod corev1.Pod
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		pods, err := in.cs.CoreV1().Pods(jobsNamespace).List(ctx, metav1.ListOptions{LabelSelector: executorSelector})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range pods.Items {
			if p.Annotations[repositoryAnnotation] == repo && p.Status.Phase == corev1.PodRunning {
				pod, found = p, true
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no running executor of %s", repo)
		}
	}
	const prefix = "gitea-dynamic-runner.io/"
	assignment, spiffeID := pod.Labels[prefix+"assignment-id"], pod.Annotations[prefix+"spiffe-id"]
	task, err := strconv.ParseInt(pod.Labels[prefix+"task-id"], 10, 64)
	if err != nil || assignment == "" || spiffeID == "" {
		t.Fatalf("executor %s: labels %v annotations %v", pod.Name, pod.Labels, pod.Annotations)
	}
	id := spiffeid.RequireFromString(spiffeID)
	other := spiffeid.RequireFromPath(id.TrustDomain(), strings.TrimSuffix(id.Path(), strconv.FormatInt(task, 10))+strconv.FormatInt(task+1000, 10))

	// The gateway from the machine: a NodePort to its mTLS port, as executors reach it.
	const nodePort = 30843
	if _, err := in.cs.CoreV1().Services(installNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "gateway-probe"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app.kubernetes.io/name": "gateway"},
			Ports:    []corev1.ServicePort{{Name: "https", Port: 8443, TargetPort: intstr.FromInt32(8443), NodePort: nodePort}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	url := "https://" + net.JoinHostPort(in.c.NodeIP(), strconv.Itoa(nodePort))

	secret := func(name string) map[string][]byte {
		s, err := in.cs.CoreV1().Secrets(installNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Data
	}
	caData := secret("gdr-identity-ca")
	ca, err := svidca.Parse(caData["ca.pem"], caData["ca-key.pem"], id.TrustDomain())
	if err != nil {
		t.Fatal(err)
	}
	var key secretkey.Key
	if err := key.Decode(string(secret("gdr-secrets")["bootstrap-key"])); err != nil {
		t.Fatal(err)
	}
	caps, err := bootstrap.NewVerifier(key)
	if err != nil {
		t.Fatal(err)
	}
	impostor, err := svidca.New(id.TrustDomain())
	if err != nil {
		t.Fatal(err)
	}
	gatewayID := spiffeid.RequireFromPath(id.TrustDomain(), "/gateway")
	cm, err := in.cs.CoreV1().ConfigMaps(installNamespace).Get(ctx, "gdr-config", metav1.GetOptions{})
	if err == nil {
		gatewayID, err = spiffeid.FromString(cm.Data["GDR_GATEWAY_SPIFFE_ID"])
	}
	if err != nil {
		t.Fatal(err)
	}
	bundle := ca.Bundle() // the client checks the gateway's certificate against the installation's CA
	client := func(signer *svidca.CA, as spiffeid.ID, assignment, capability string) func(context.Context, *runnerv1.UpdateLogRequest) error {
		svid, err := signer.Mint(as, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		c := gateway.NewClient(url, gateway.Credentials{SVID: svid, Bundle: x509bundle.NewSet(bundle), AssignmentID: assignment, Capability: capability},
			tlsconfig.AuthorizeID(gatewayID))
		return func(ctx context.Context, req *runnerv1.UpdateLogRequest) error {
			_, err := c.UpdateLog(ctx, connect.NewRequest(req))
			return err
		}
	}
	otherAssignment := pod.Labels[prefix+"pool"] + "-" + strconv.FormatInt(task+1000, 10)
	probes := []struct {
		name string
		call func(context.Context, *runnerv1.UpdateLogRequest) error
		want connect.Code
	}{
		{"forged", client(impostor, id, assignment, caps.Capability(assignment, task, id.String())), 0},
		{"re-targeted", client(ca, other, otherAssignment, caps.Capability(otherAssignment, task+1000, other.String())), connect.CodePermissionDenied},
		{"stolen capability", client(ca, other, assignment, caps.Capability(assignment, task, id.String())), connect.CodeUnauthenticated},
	}
	for i, p := range probes {
		line := fmt.Sprintf("gdr-probe-%d %s", i, p.name)
		var err error
		for attempt := 0; attempt < 30; attempt++ { // the gateway may be starting: connection refused is retried
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			err = p.call(cctx, &runnerv1.UpdateLogRequest{TaskId: task, Index: 1 << 20, Rows: []*runnerv1.LogRow{{Content: line}}})
			cancel()
			if err == nil || !strings.Contains(err.Error(), "connection refused") {
				break
			}
			time.Sleep(2 * time.Second)
		}
		switch {
		case err == nil:
			t.Errorf("%s: the gateway accepted it", p.name)
		case p.want == 0 && !handshakeRefused(err):
			t.Errorf("%s: %v, want the TLS handshake refused", p.name, err)
		case p.want != 0 && connect.CodeOf(err) != p.want:
			t.Errorf("%s: %v, want %v", p.name, err, p.want)
		default:
			t.Logf("%s: refused: %v", p.name, err)
		}
	}
}

// leftAfterUninstall lists every object left in the release's and the executors' namespaces
// but what the operator made before the install (operators: their names) and what Kubernetes
// puts in every namespace: after helm uninstall, what is left of ours.
func (in *installation) leftAfterUninstall(ctx context.Context, t *testing.T, operators map[string]bool) []string {
	t.Helper()
	dyn, err := dynamic.NewForConfig(in.c.Plane.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	kinds := []schema.GroupVersionResource{
		{Version: "v1", Resource: "pods"}, {Version: "v1", Resource: "services"}, {Version: "v1", Resource: "configmaps"},
		{Version: "v1", Resource: "secrets"}, {Version: "v1", Resource: "serviceaccounts"},
		{Version: "v1", Resource: "persistentvolumeclaims"},
		{Group: "apps", Version: "v1", Resource: "deployments"}, {Group: "batch", Version: "v1", Resource: "jobs"},
		{Group: "batch", Version: "v1", Resource: "cronjobs"},
		{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
		{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
		{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"},
		{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledobjects"}, {Group: "keda.sh", Version: "v1alpha1", Resource: "scaledjobs"},
	}
	var left []string
	for _, ns := range []string{installNamespace, jobsNamespace} {
		for _, k := range kinds {
			list, err := dyn.Resource(k).Namespace(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatalf("list %s in %s: %v", k.Resource, ns, err)
			}
			for _, o := range list.Items {
				name := o.GetName()
				switch {
				case operators[name], name == "default" && k.Resource == "serviceaccounts", name == "kube-root-ca.crt":
					continue
				}
				left = append(left, fmt.Sprintf("%s %s/%s", k.Resource, ns, name))
			}
		}
	}
	return left
}

// handshakeRefused reports whether err is the TLS handshake refused, before any HTTP exchange:
// the server's alert, or, as TLS 1.3 clients learn of a refused certificate only on their first
// read, the connection closed under the request. An answer of the gateway's (a Connect code it
// sent) is not: that needs the handshake to have succeeded.
func handshakeRefused(err error) bool {
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() != connect.CodeUnavailable && ce.Code() != connect.CodeUnknown {
		return false
	}
	for _, s := range []string{"tls: ", "EOF", "connection reset by peer", "use of closed network connection", "broken pipe"} {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}
