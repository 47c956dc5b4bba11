//go:build e2e

package deploy

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
)

// BenchmarkE2EClusterPickup measures, on deploy/keda installed into the real
// single-node cluster (installKEDA), the time from a push (the contents API
// call returning) to the job's first step running in Gitea, for b.N jobs one
// after another (each pushed once the one before has ended and its executor
// Pod is gone), and splits it where the cluster shows a step:
//
//	queued  push -> the assignment waits on handle-pod's consumer (nats-server's /jsz, what KEDA reads)
//	keda    -> KEDA's handle Job exists (its polling: pollingInterval 2 s)
//	handle  -> the executor Pod exists (handle's Pod started, bound the consumer, Accept)
//	pod     -> the runner container is running (scheduling, the install init container, containerd)
//	runner  -> the first step is running in Gitea (runner start, SVID, gateway, first report)
//
// The test observes each itself: /jsz polled every 50 ms, watches on Jobs and
// Pods (the arrival of the first event showing the object or the state),
// Gitea's jobs API polled every 100 ms. It reports the p50 of each, in ms.
// GDR_BENCH_SPIRE_SYNC sets the SPIRE agent's sync interval (SPIRE's default
// and most: 5 s), which bounds how long a new executor waits for its SVID.
//
//	go test -tags e2e -run '^$' -bench E2EClusterPickup -benchtime 10x ./deploy/
//	GDR_BENCH_SPIRE_SYNC=1s go test -tags e2e -run '^$' -bench E2EClusterPickup -benchtime 10x ./deploy/
func BenchmarkE2EClusterPickup(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var spireSync time.Duration
	if v := os.Getenv("GDR_BENCH_SPIRE_SYNC"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("GDR_BENCH_SPIRE_SYNC: %v", err)
		}
		spireSync = d
	}
	in := installKEDA(ctx, b, spireSync)
	repo := in.g.CreateRepo(b, "bench")
	seen := newSightings()
	go seen.pollQueue(ctx, in.monitor)
	go seen.watchJobs(ctx, b, in)
	go seen.watchPods(ctx, b, in)

	var total, queued, keda, handle, pod, runner []time.Duration
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("b%d", i)
		in.g.PushWorkflow(b, repo, ".gitea/workflows/bench.yml",
			"on: push\njobs:\n  "+name+":\n    runs-on: ubuntu-latest\n    steps:\n      - run: sleep 1\n")
		pushed := time.Now()
		for deadline := pushed.Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			running := false
			for _, j := range in.g.Jobs(b, repo) {
				if j.Name == name && stepRunning(j) {
					running = true
				}
			}
			if running {
				break
			}
			if time.Now().After(deadline) {
				in.dump(ctx, b)
				b.Fatalf("job %s not running 3 minutes after its push", name)
			}
		}
		started := time.Now()
		q, j, p, r := seen.after(pushed)
		if q.IsZero() || j.IsZero() || p.IsZero() || r.IsZero() {
			b.Fatalf("job %s: a step went unseen (queued %v, handle Job %v, Pod %v, running %v)", name, q, j, p, r)
		}
		total = append(total, started.Sub(pushed))
		queued = append(queued, q.Sub(pushed))
		keda = append(keda, j.Sub(q))
		handle = append(handle, p.Sub(j))
		pod = append(pod, r.Sub(p))
		runner = append(runner, started.Sub(r))
		b.Logf("%s: total %v = queued %v + keda %v + handle %v + pod %v + runner %v", name,
			total[i].Round(time.Millisecond), queued[i].Round(time.Millisecond), keda[i].Round(time.Millisecond),
			handle[i].Round(time.Millisecond), pod[i].Round(time.Millisecond), runner[i].Round(time.Millisecond))

		// The next job starts from an idle installation.
		in.waitCompleted(ctx, b, repo, name, 3*time.Minute)
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
			pods, err := in.cs.CoreV1().Pods(jobsNamespace).List(ctx, metav1.ListOptions{LabelSelector: executorSelector})
			if err != nil {
				b.Fatal(err)
			}
			if len(pods.Items) == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("executor Pods left after job %s: %d", name, len(pods.Items))
			}
		}
	}
	b.StopTimer()
	for _, m := range []struct {
		unit string
		d    []time.Duration
	}{
		{"total-p50-ms", total}, {"queued-p50-ms", queued}, {"keda-p50-ms", keda},
		{"handle-p50-ms", handle}, {"pod-p50-ms", pod}, {"runner-p50-ms", runner},
	} {
		b.ReportMetric(float64(p50(m.d).Milliseconds()), m.unit)
	}
	b.ReportMetric(float64(p95(total).Milliseconds()), "total-p95-ms")
}

// sightings are the times the benchmark saw each step, in order.
type sightings struct {
	mu      sync.Mutex
	queued  []time.Time          // /jsz: the consumer's pending count rose from 0
	jobs    map[string]time.Time // handle Job name -> first seen
	pods    map[string]time.Time // executor Pod name -> first seen
	running map[string]time.Time // executor Pod name -> runner container first seen running
}

func newSightings() *sightings {
	return &sightings{jobs: map[string]time.Time{}, pods: map[string]time.Time{}, running: map[string]time.Time{}}
}

// after returns the first sighting of each step at or after t0 (zero when
// none): the queue's rise, a handle Job, an executor Pod, and that Pod's
// runner running.
func (s *sightings) after(t0 time.Time) (queued, job, pod, running time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first := func(ts []time.Time) time.Time {
		var out time.Time
		for _, t := range ts {
			if !t.Before(t0) && (out.IsZero() || t.Before(out)) {
				out = t
			}
		}
		return out
	}
	queued = first(s.queued)
	var jobs []time.Time
	for _, t := range s.jobs {
		jobs = append(jobs, t)
	}
	job = first(jobs)
	var podName string
	for name, t := range s.pods {
		if !t.Before(t0) && (pod.IsZero() || t.Before(pod)) {
			pod, podName = t, name
		}
	}
	if podName != "" {
		running = s.running[podName]
	}
	return queued, job, pod, running
}

// pollQueue polls nats-server's /jsz every 50 ms and notes each rise of
// handle-pod's consumer's pending count (stored or unacknowledged) from 0.
func (s *sightings) pollQueue(ctx context.Context, monitor string) {
	var prev uint64
	for ctx.Err() == nil {
		c, _, err := jetstreamenv.MonitoredConsumer(ctx, monitor, "CI_RUNNER", "pod")
		if n := c.Pending + c.AckPending; err == nil {
			if n > 0 && prev == 0 {
				s.mu.Lock()
				s.queued = append(s.queued, time.Now())
				s.mu.Unlock()
			}
			prev = n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// watchJobs notes when each of KEDA's handle-pod Jobs is first seen.
func (s *sightings) watchJobs(ctx context.Context, tb testing.TB, in *installation) {
	w, err := in.cs.BatchV1().Jobs(installNamespace).Watch(ctx, metav1.ListOptions{LabelSelector: "scaledjob.keda.sh/name=handle-pod"})
	if err != nil {
		tb.Errorf("watch handle Jobs: %v", err)
		return
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		j, ok := ev.Object.(*batchv1.Job)
		if !ok || ev.Type != watch.Added {
			continue
		}
		s.mu.Lock()
		if _, ok := s.jobs[j.Name]; !ok {
			s.jobs[j.Name] = time.Now()
		}
		s.mu.Unlock()
	}
}

// watchPods notes when each executor Pod is first seen and when its runner
// container is first seen running.
func (s *sightings) watchPods(ctx context.Context, tb testing.TB, in *installation) {
	w, err := in.cs.CoreV1().Pods(jobsNamespace).Watch(ctx, metav1.ListOptions{LabelSelector: executorSelector})
	if err != nil {
		tb.Errorf("watch executor Pods: %v", err)
		return
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			continue
		}
		now := time.Now()
		s.mu.Lock()
		if _, ok := s.pods[p.Name]; !ok && ev.Type == watch.Added {
			s.pods[p.Name] = now
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Name == "runner" && c.State.Running != nil {
				if _, ok := s.running[p.Name]; !ok {
					s.running[p.Name] = now
				}
			}
		}
		s.mu.Unlock()
	}
}

func p50(d []time.Duration) time.Duration { return quantile(d, 0.5) }
func p95(d []time.Duration) time.Duration { return quantile(d, 0.95) }

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}
