//go:build e2e

package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kubeenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/pull"
)

// clientResources are the resources handle's pod backend asks about; the
// API server's own requests (LimitRanger's LIST limitranges, its leases and
// endpoints) are counted apart.
var clientResources = []string{"pods", "secrets", "nodes", "events"}

// floorCalls is how many Pods a floor worker creates per assignment of a
// handle worker: as many API calls as handle makes for one (5), so that the
// client's burst weighs the same on both sides.
const floorCalls = 5

// rateProfile is the benchmark pool's pod profile: one runner container.
const rateProfile = `{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"runner:v1"}]}}}`

// BenchmarkE2EHandleRate measures how many assignments handle accepts, and
// so executor Pods it creates, per second against a real kube-apiserver
// v1.37.2 + etcd (internal/testenv/kubeenv: no kubelet, the Pods stay
// Pending, which Accept does not wait for with GDR_POD_IDENTITY=ca) and a
// real JetStream (embedded), with 1, 5 and 10 workers side by side. Each
// worker is a handle run as its Job runs it: its own NATS connection, its
// consumer bound (q.Consumer), its end marks (OpenEndings), and its handler
// and pod backend from handle's Config through newHandler, hence its own
// Kubernetes client built from KUBECONFIG by pod.Build with the Config's
// GDR_KUBE_QPS / GDR_KUBE_BURST; then pull.Assignments settles messages
// (open the signed envelope, decode, Worker.Accept: Find, end mark, mint
// the SVID with the installation's CA, create the Pod and its Secret, check
// both; confirmed ack). b.N is the number of assignments per worker,
// published (signed, by assignmentqueue.Queue) before the timer starts; the
// rate is b.N x workers over the time from the start to the last Accepted.
//
// Sub-benchmarks, for each client limit (qps=5/burst=10 is client-go's
// default, what handle shipped with before GDR_KUBE_QPS existed; 50/100 is
// GDR_KUBE_QPS's default; -1 is no client-side limit):
//
//   - warm: GDR_LINGER=1s, one run per worker takes message after message
//     (also what GDR_BATCH > 1 does): its one client's limit applies to all;
//   - cold (client-go's default limit only): GDR_BATCH=1, GDR_LINGER=0,
//     KEDA's default: every message is a run of its own with a fresh
//     connection, handler and client (the process start, measured by
//     BenchmarkColdStart, is not in it);
//   - floor: the same number of workers, each with a client of the same
//     limit (pod.LimitedClient from the same KUBECONFIG), creating
//     floorCalls x b.N bare Pods each, one after another (as many calls as
//     handle makes for b.N assignments): the API server's and the limiter's
//     rate with nothing of ours.
//
// And without a client limit, list-vs-get: in a namespace of 200 Pods, b.N
// label-selected LISTs of one Pod (Find's call) one after another, b.N GETs
// of a Pod by name, and b.N such LISTs each right after a Secret is created,
// reporting each one's mean latency: a consistent LIST is served from the
// API server's watch cache of Pods once that cache has caught up with etcd's
// latest revision, which a write to another resource moved on; the cache
// learns it from etcd's progress notifications, which the server requests
// every 100 ms.
//
// Each sub-benchmark has a namespace of its own. API calls are counted by
// the API server (apiserver_request_total, read before and after):
// calls/op is the clients' per assignment (per Pod for the floor), by verb
// and resource in the log, with the server's own LIST limitranges
// (LimitRanger admission) beside them.
//
//	CI=true go test -tags e2e -run '^$' -bench E2EHandleRate -benchtime 20x -timeout 30m -v ./functions/handle/
func BenchmarkE2EHandleRate(b *testing.B) {
	plane, err := kubeenv.Start(kubeenv.Assets(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = plane.Stop() })
	admin := plane.Client(b)
	dir := b.TempDir()
	if err := plane.WriteKubeconfig(filepath.Join(dir, "kubeconfig")); err != nil {
		b.Fatal(err)
	}
	b.Setenv("KUBECONFIG", filepath.Join(dir, "kubeconfig"))
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	if _, err := svidca.LoadOrCreate(filepath.Join(dir, "ca"), td); err != nil {
		b.Fatal(err)
	}
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 1000, profile: "+rateProfile+"}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	queue := jetstreamenv.NewQueue(b)
	queue.OpenConsumer(b, taskassignment.BackendPod, 1000) // handle's setup mode, once
	for k, v := range map[string]string{
		"GDR_MODE": "job", "GDR_BACKEND": "pod", "GDR_POD_IDENTITY": "ca", "GDR_CA_DIR": filepath.Join(dir, "ca"),
		"GDR_NATS_URL": queue.URL, "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir, "GDR_TRUST_DOMAIN": td.Name(),
		"GDR_ASSIGNMENT_VERIFY_KEYS": base64.StdEncoding.EncodeToString(queue.Signer.Public()),
		"GDR_BOOTSTRAP_KEY":          goodKey, "GDR_GATEWAY_URL": "https://gateway.example.org",
	} {
		b.Setenv(k, v)
	}
	base, err := loadConfig()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	var task atomic.Int64 // every assignment is new: task IDs go on across sub-benchmarks
	publish := func(b *testing.B, n int) {
		b.Helper()
		for range n {
			t := task.Add(1)
			id, err := taskidentity.New(td, "alice/repo", "build", t)
			if err != nil {
				b.Fatal(err)
			}
			a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: t, Pool: "linux"}, id)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := queue.Queue.Publish(ctx, a); err != nil {
				b.Fatal(err)
			}
		}
	}

	for _, limit := range []struct {
		qps   float32
		burst int
		cold  bool
	}{{5, 10, true}, {50, 100, false}, {-1, 0, false}} {
		name := fmt.Sprintf("qps=%g/burst=%d", limit.qps, limit.burst)
		for _, workers := range []int{1, 5, 10} {
			modes := []string{"warm", "floor"}
			if limit.cold {
				modes = []string{"warm", "cold", "floor"}
			}
			for _, mode := range modes {
				b.Run(fmt.Sprintf("%s/workers=%d/%s", name, workers, mode), func(b *testing.B) {
					cfg := base
					cfg.KubeQPS, cfg.KubeBurst = limit.qps, limit.burst
					cfg.KubeNamespace = plane.Namespace(b)
					n := b.N * workers
					if mode != "floor" {
						publish(b, n)
					}
					before := requests(b, plane)
					var last lastAccepted
					b.ResetTimer()
					start := time.Now()
					var err error
					switch mode {
					case "warm":
						cfg.Linger = time.Second
						err = runWorkers(workers, func() error { return handleRun(ctx, cfg, &last, log) })
					case "cold":
						err = runWorkers(workers, func() error {
							for last.count() < n {
								if err := handleRun(ctx, cfg, &last, log); err != nil {
									return err
								}
							}
							return nil
						})
					case "floor":
						n = floorCalls * b.N * workers
						err = runWorkers(workers, func() error { return createPods(ctx, cfg, floorCalls*b.N, &last) })
					}
					if err != nil {
						b.Fatal(err)
					}
					elapsed := last.at().Sub(start)
					b.StopTimer()
					calls := requests(b, plane).Minus(before)
					if got := last.count(); got != n {
						b.Fatalf("%d accepted (or created), want %d", got, n)
					}
					if mode != "floor" {
						left, err := queue.Queue.Outstanding(ctx, taskassignment.BackendPod)
						if err != nil || left != 0 {
							b.Fatalf("%d messages left (%v)", left, err)
						}
					}
					pods, err := admin.CoreV1().Pods(cfg.KubeNamespace).List(ctx, metav1.ListOptions{})
					if err != nil || len(pods.Items) != n {
						b.Fatalf("%d Pods in the namespace (%v), want %d", len(pods.Items), err, n)
					}
					b.ReportMetric(float64(n)/elapsed.Seconds(), "pods/s")
					b.ReportMetric(float64(n)/elapsed.Seconds()/float64(workers), "pods/s/worker")
					b.ReportMetric(calls.Only(clientResources...).Total()/float64(n), "calls/op")
					b.Logf("%d workers, %d %s: %.1f Pods/s in %s; API calls per Pod: %s; the API server's own: %s", workers, n, mode, float64(n)/elapsed.Seconds(),
						elapsed.Round(time.Millisecond), calls.Only(clientResources...).Per(n), calls.Without(clientResources...).Per(n))
				})
			}
		}
	}
	b.Run("qps=-1/burst=0/list-vs-get", func(b *testing.B) {
		ns := plane.Namespace(b)
		pods := admin.CoreV1().Pods(ns)
		for i := range 200 {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i), Labels: map[string]string{"n": fmt.Sprint(i)}},
				Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "runner", Image: "runner:v1"}}},
			}
			if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ResetTimer()
		start := time.Now()
		for i := range b.N {
			list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: fmt.Sprintf("n=%d", i%200)})
			if err != nil || len(list.Items) != 1 {
				b.Fatalf("list: %d Pods, %v", len(list.Items), err)
			}
		}
		listTime := time.Since(start)
		start = time.Now()
		for i := range b.N {
			if _, err := pods.Get(ctx, fmt.Sprintf("p-%d", i%200), metav1.GetOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		getTime := time.Since(start)
		// Each LIST right after a write to another resource (a Secret,
		// as Create writes before the next Find), the LISTs alone timed.
		var afterWrite time.Duration
		for i := range b.N {
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s-%d", i)}}
			if _, err := admin.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: fmt.Sprintf("n=%d", i%200)})
			if err != nil || len(list.Items) != 1 {
				b.Fatalf("list: %d Pods, %v", len(list.Items), err)
			}
			afterWrite += time.Since(t0)
		}
		b.StopTimer()
		b.ReportMetric(float64(listTime.Microseconds())/1000/float64(b.N), "list-ms")
		b.ReportMetric(float64(getTime.Microseconds())/1000/float64(b.N), "get-ms")
		b.ReportMetric(float64(afterWrite.Microseconds())/1000/float64(b.N), "list-after-write-ms")
	})
}

// handleRun is one run of handle's job mode as serve and runJob run it
// (their code, but for the Observer, which records the last acceptance):
// connect to NATS, bind the consumer, open the end marks, build the handler
// (and with it the pod backend and its Kubernetes client), settle messages.
func handleRun(ctx context.Context, cfg Config, obs handler.Observer, log *slog.Logger) error {
	nc, js, err := natsconn.Connect(ctx, cfg.ConnSettings, "handle-"+cfg.Backend)
	if err != nil {
		return err
	}
	defer func() { _ = natsconn.Close(nc) }()
	consumer, err := assignmentqueue.New(js, cfg.Stream).Consumer(ctx, taskassignment.BackendKind(cfg.Backend))
	if err != nil {
		return err
	}
	endings, err := assignmentqueue.OpenEndings(ctx, js, assignmentqueue.EndingsBucket(cfg.PayloadBucket))
	if err != nil {
		return err
	}
	h, closeBackend, err := newHandler(cfg, endings, log)
	if err != nil {
		return err
	}
	defer func() { _ = closeBackend() }()
	h.Observer = obs
	sum, err := pull.Assignments{
		Decider: h, Log: log,
		Consumer: consumer, Batch: cfg.Batch, Wait: cfg.FetchWait, HoldFor: cfg.HoldFor,
		Linger: cfg.Linger, LingerMax: cfg.LingerMax,
	}.Run(ctx)
	if err == nil && sum.Accepted != sum.Fetched {
		err = fmt.Errorf("run %+v: not everything fetched was accepted", sum)
	}
	return err
}

// createPods is the floor: a client as pod.Build makes it (KUBECONFIG, the
// Config's limit) creating n bare Pods one after another.
func createPods(ctx context.Context, cfg Config, n int, last *lastAccepted) error {
	client, err := pod.LimitedClient(cfg.KubeQPS, cfg.KubeBurst)
	if err != nil {
		return err
	}
	for range n {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "floor-", Namespace: cfg.KubeNamespace},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "runner", Image: "runner:v1"}}},
		}
		if _, err := client.CoreV1().Pods(cfg.KubeNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Pod: %w", err)
		}
		last.Handled(taskassignment.BackendPod, handler.Accepted)
	}
	return nil
}

// runWorkers runs n copies of work side by side and returns the first error.
func runWorkers(n int, work func() error) error {
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- work()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// lastAccepted counts Accepted outcomes and keeps the time of the last.
type lastAccepted struct {
	mu   sync.Mutex
	n    int
	last time.Time
}

func (l *lastAccepted) Handled(_ taskassignment.BackendKind, o handler.Outcome) {
	if o != handler.Accepted {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	l.last = time.Now()
}

func (l *lastAccepted) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *lastAccepted) at() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// requests are the API server's request counts so far.
func requests(b *testing.B, plane *kubeenv.Plane) kubeenv.Requests {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := plane.Requests(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return r
}
