//go:build e2e

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kubeenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/pull"
)

// giteaTasks is Gitea's side for the benchmark: a task is over once
// reported.
type giteaTasks struct {
	mu       sync.Mutex
	reported map[int64]executor.Phase
}

func (g *giteaTasks) Terminal(_ context.Context, id int64) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.reported[id]
	return ok, nil
}

func (g *giteaTasks) Report(_ context.Context, id int64, e executor.Executor) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reported[id] = e.Phase
	return nil
}

// finishPods is how many executors one op of BenchmarkE2EFinish finishes.
const finishPods = 20

// BenchmarkE2EFinish measures the cluster's finish path against a real
// kube-apiserver (and etcd), a real SPIRE server and an embedded NATS:
// finishPods executor Pods per op of the pod backend, each created and bound by Worker.Accept
// as handle does, then, one at a time, its Pod's phase set to Succeeded (what
// the kubelet does once the runner exits; no kubelet runs here) and its
// finish notice published (what the gateway does once Gitea accepted the
// final result), to the Pod's deletion seen by a watch: finish -> executor
// gone; and on to its payload's deletion (polled every 2 ms), which frees
// the task's slot: finish -> slot free. recover's finish mode runs in-process, in a loop of runs as KEDA's
// ScaledJob would start them, so a Job's start (KEDA's polling interval and
// the Pod's start) is not in the figure. It reports finish-p50-ms,
// finish-max-ms and freed-p50-ms, and checks that every task was reported once and every
// payload deleted.
//
// With GDR_BENCH_EXIT_AFTER (a duration), the Pod reaches Succeeded that long
// after the notice instead of just before it: a runner still exiting when its
// notice is handled, which finish mode hands back for GDR_RECOVER_RETRY.
//
//	CI=true go test -tags e2e -run '^$' -bench E2EFinish -benchtime 1x ./functions/recover/
//	GDR_BENCH_EXIT_AFTER=500ms CI=true go test -tags e2e -run '^$' -bench E2EFinish -benchtime 1x ./functions/recover/
func BenchmarkE2EFinish(b *testing.B) {
	var exitAfter time.Duration
	if v := os.Getenv("GDR_BENCH_EXIT_AFTER"); v != "" {
		var err error
		if exitAfter, err = time.ParseDuration(v); err != nil {
			b.Fatalf("GDR_BENCH_EXIT_AFTER: %v", err)
		}
	}
	plane, err := kubeenv.Start(kubeenv.Assets(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = plane.Stop() }) // after the namespace's own cleanup
	client, ns := plane.Client(b), plane.Namespace(b)
	spire := spireenv.Start(b)
	td := spiffeid.RequireTrustDomainFromString(spireenv.TrustDomain)
	keys, err := taskassignment.NewKeys("ci.example.org")
	if err != nil {
		b.Fatal(err)
	}
	pool := runnerpool.Pool{Name: "linux", Backend: taskassignment.BackendPod, Capacity: 100,
		JobTimeout: runnerpool.Duration(90 * time.Minute),
		Profile:    json.RawMessage(`{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"runner:v1"}]}}}`)}
	backend, err := pod.New(pod.Config{Client: client, Namespace: ns, Keys: keys, TrustDomain: td,
		Pools: runnerpool.Pools{pool}, Entries: spire.Entries(), Cluster: "test-cluster"})
	if err != nil {
		b.Fatal(err)
	}
	boot, err := bootstrap.New(secretkey.Key(strings.Repeat("k", bootstrap.MinKeyLength)), "https://gateway.example.org:8443",
		spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	if err != nil {
		b.Fatal(err)
	}
	q := jetstreamenv.NewQueue(b)
	finished := assignmentqueue.NewFinished(q.JetStream, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := finished.Ensure(ctx, taskassignment.BackendPod); err != nil {
		b.Fatal(err)
	}
	consumer, err := finished.Consumer(ctx, taskassignment.BackendPod)
	if err != nil {
		b.Fatal(err)
	}
	gitea := &giteaTasks{reported: map[int64]executor.Phase{}}
	r := &recoverer.Recoverer{TrustDomain: td, Keys: keys, Bootstrap: boot,
		Backends: map[taskassignment.BackendKind]executor.Backend{taskassignment.BackendPod: backend},
		Pools:    map[string]recoverer.Pool{"linux": {Pool: pool, Tasks: gitea}},
		Queue:    q.Queue, Sender: q.Queue, Payloads: q.Payloads}

	// The executors, as handle leaves them: created, scheduled, bound, running.
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ns + "-node"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w := executor.Worker{Backend: backend, Tasks: gitea, Bootstrap: boot, Keys: keys}
	var as []taskassignment.Assignment
	for i := range b.N * finishPods {
		id := int64(i + 1)
		identity, err := taskidentity.New(td, "owner/repo", "build", id)
		if err != nil {
			b.Fatal(err)
		}
		a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: id, Pool: "linux"}, identity)
		if err != nil {
			b.Fatal(err)
		}
		if err := q.Payloads.Put(ctx, a.ID, &runnerv1.Task{Id: id}); err != nil {
			b.Fatal(err)
		}
		if _, err := w.Accept(ctx, a); err != nil {
			b.Fatal(err)
		}
		name := backend.PodName(a.ID)
		if err := client.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name},
			Target: corev1.ObjectReference{Kind: "Node", Name: node.Name}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if ok, err := w.Accept(ctx, a); err != nil || !ok {
			b.Fatalf("Accept of a scheduled executor = %v, %v", ok, err)
		}
		setPhase(ctx, b, client.CoreV1().Pods(ns), name, corev1.PodRunning)
		as = append(as, a)
	}

	// Pod deletions, as the API server reports them.
	watcher, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer watcher.Stop()
	gone := make(chan string, len(as))
	go func() {
		for ev := range watcher.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Deleted {
				gone <- pod.Name
			}
		}
	}()

	// recover's finish mode: one run after another, as KEDA starts them.
	runCtx, stopRuns := context.WithCancel(ctx)
	runsDone := make(chan struct{})
	go func() {
		defer close(runsDone)
		n := pull.Notices{
			Decider: recoverer.NoticeHandler{Recoverer: r, Backend: taskassignment.BackendPod, Executors: recoverer.Listed(backend), Retry: 2 * time.Second},
			Backend: taskassignment.BackendPod, Consumer: consumer, Batch: 8, Wait: 2 * time.Second,
		}
		for runCtx.Err() == nil {
			if _, err := n.Run(runCtx); err != nil {
				b.Error(err)
				return
			}
		}
	}()

	var lat, freed []time.Duration
	b.ResetTimer()
	for _, a := range as {
		name := backend.PodName(a.ID)
		start := time.Now()
		if exitAfter == 0 {
			setPhase(ctx, b, client.CoreV1().Pods(ns), name, corev1.PodSucceeded)
		}
		if err := finished.Publish(ctx, taskassignment.BackendPod, a.ID); err != nil {
			b.Fatal(err)
		}
		if exitAfter > 0 { // the runner exits after its final report: the notice comes first
			time.Sleep(exitAfter)
			setPhase(ctx, b, client.CoreV1().Pods(ns), name, corev1.PodSucceeded)
		}
		for got := ""; got != name; {
			select {
			case got = <-gone:
			case <-time.After(time.Minute):
				b.Fatalf("Pod %s not deleted within a minute of its finish notice", name)
			}
		}
		lat = append(lat, time.Since(start))
		// Then the payload: its deletion frees the task's slot (the last step of Finish).
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Millisecond) {
			if _, err := q.Payloads.Get(ctx, a.ID); err != nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("payload of %s still stored a minute after its finish notice", a.ID)
			}
		}
		freed = append(freed, time.Since(start))
	}
	b.StopTimer()
	stopRuns()
	<-runsDone

	for _, a := range as {
		if gitea.reported[a.Task.ID] != executor.PhaseSucceeded {
			b.Errorf("task %d reported %q", a.Task.ID, gitea.reported[a.Task.ID])
		}
		if _, err := q.Payloads.Get(ctx, a.ID); err == nil {
			b.Errorf("payload of %s still stored", a.ID)
		}
		if _, err := client.CoreV1().Secrets(ns).Get(ctx, pod.SecretName(backend.PodName(a.ID)), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			b.Errorf("Secret of %s: %v, want not found", a.ID, err)
		}
	}
	if n := len(spire.AllEntries(b)); n != 0 {
		b.Errorf("%d SPIRE entries left", n)
	}
	slices.Sort(lat)
	slices.Sort(freed)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "finish-p50-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "finish-max-ms")
	b.ReportMetric(float64(freed[len(freed)/2].Microseconds())/1000, "freed-p50-ms")
	b.Logf("over %d Pods: finish -> executor gone p50 %s, max %s; finish -> payload deleted (slot free) p50 %s, max %s",
		len(lat), lat[len(lat)/2], lat[len(lat)-1], freed[len(freed)/2], freed[len(freed)-1])
}

// podStatuses is the Pods API as setPhase uses it.
type podStatuses interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error)
	UpdateStatus(ctx context.Context, pod *corev1.Pod, opts metav1.UpdateOptions) (*corev1.Pod, error)
}

// setPhase writes the Pod's status phase, as the kubelet does.
func setPhase(ctx context.Context, b *testing.B, pods podStatuses, name string, phase corev1.PodPhase) {
	b.Helper()
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	p.Status.Phase = phase
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		b.Fatal(fmt.Errorf("set Pod %s phase %s: %w", name, phase, err))
	}
}
