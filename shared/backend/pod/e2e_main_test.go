//go:build e2e

package pod

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kubeenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// plane is the one kube-apiserver + etcd of this test package.
var plane kubeenv.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	plane.Stop()
	os.Exit(code)
}

// counter counts the HTTP requests a client makes.
type counter struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c counter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(r)
}

// countingClient returns a clientset whose requests are counted in n.
func countingClient(t testing.TB, cfg *rest.Config, n *atomic.Int64) kubernetes.Interface {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return counter{rt: rt, n: n} }
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// e2eEnv is one test's namespace on the shared plane.
type e2eEnv struct {
	plane  *kubeenv.Plane
	client kubernetes.Interface
	ns     string
	keys   taskassignment.Keys
	td     spiffeid.TrustDomain
}

func newEnv(t testing.TB) e2eEnv {
	t.Helper()
	p := plane.Plane(t)
	keys, err := taskassignment.NewKeys("ci.example.org")
	if err != nil {
		t.Fatal(err)
	}
	return e2eEnv{plane: p, client: p.Client(t), ns: p.Namespace(t), keys: keys,
		td: spiffeid.RequireTrustDomainFromString(spireenv.TrustDomain)}
}

// config is the backend configuration of env with entries (nil: no binding).
func (env e2eEnv) config(entries EntryClient) Config {
	if entries == nil {
		entries = nopEntries{}
	}
	return Config{
		Client:      env.client,
		Namespace:   env.ns,
		Keys:        env.keys,
		TrustDomain: env.td,
		Pools: runnerpool.Pools{{
			Name: "linux", Backend: taskassignment.BackendPod,
			JobTimeout: runnerpool.Duration(90 * time.Minute), Profile: json.RawMessage(testTemplate),
		}},
		Entries: entries,
		Cluster: "test-cluster",
	}
}

func (env e2eEnv) backend(t testing.TB, entries EntryClient) *Backend {
	t.Helper()
	b, err := New(env.config(entries))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// schedule binds the Pod to node through the binding subresource (what the
// scheduler does) and, if withNode, creates the Node object. It returns the
// Node's UID ("" without the Node).
func (env e2eEnv) schedule(t testing.TB, pod, node string, withNode bool) string {
	t.Helper()
	ctx := ctxT(t)
	err := env.client.CoreV1().Pods(env.ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("bind Pod %s to node %s: %v", pod, node, err)
	}
	if !withNode {
		return ""
	}
	return env.node(t, node)
}

// node creates the Node if needed and returns its UID.
func (env e2eEnv) node(t testing.TB, name string) string {
	t.Helper()
	ctx := ctxT(t)
	n, err := env.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		return string(n.UID)
	}
	n, err = env.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Node %s: %v", name, err)
	}
	return string(n.UID)
}

// setPhase writes the Pod's status phase (what the kubelet does).
func (env e2eEnv) setPhase(t testing.TB, pod string, phase corev1.PodPhase) {
	t.Helper()
	ctx := ctxT(t)
	p, err := env.client.CoreV1().Pods(env.ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = phase
	if _, err := env.client.CoreV1().Pods(env.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set Pod %s phase %s: %v", pod, phase, err)
	}
}
