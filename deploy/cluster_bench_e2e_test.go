//go:build e2e

package deploy

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
)

// BenchmarkE2EClusterPickup measures, on deploy/keda installed into the real
// single-node cluster (installKEDAWith), the time from a push (the contents
// API call returning) to the job's first step running in Gitea, against
// Gitea's floor for that very push: every job has a twin in the same
// workflow, on a label no pool serves, which a bare FetchTask loop claims
// (polling every 50 ms, at once again after a claim; Gitea creates a run's
// jobs in one transaction, so both are fetchable at the same moment). Each
// variant (how the executor gets its SVID, Gitea's webhook queue) installs a
// cluster of its own and runs
//
//	single  GDR_BENCH_JOBS jobs (default 10) one after another, each pushed
//	        once the one before has ended and its executor Pod is gone (a
//	        lingering handle usually takes the next: warm);
//	lone    GDR_BENCH_LONE jobs (default 3) one after another, each pushed
//	        once no handle runs at all: the first job after a quiet spell
//	        (cold: KEDA's poll and a new handle Job on its path; dispatch and
//	        the gateway still up, within their cooldownPeriod);
//	idle    GDR_BENCH_IDLE jobs (default 5) one after another, each pushed
//	        once nothing of ours runs at all (waitZero: dispatch and the
//	        gateway scaled to zero, no handle): the first job after a quiet
//	        night, KEDA's poll of Gitea's queue and dispatch's start on its path;
//	burst   GDR_BENCH_JOBS jobs in one push;
//	floor burst  GDR_BENCH_JOBS twins alone in one push: Gitea's floor for a
//	        burst without our jobs' load on Gitea (our idle polling still runs).
//
// and prints, for each, `cluster pickup <variant>/<single|lone|burst> p50 <s>
// p95 <s> floor p50 <s> over floor p50 <s> p95 <s>`, where "over floor" is
// each job's paired difference to its own twin (the same push), and for
// single and lone also where the time went:
//
//	queued  push -> the assignment is stored in the stream (the server's time, from /jsz)
//	handle  -> the executor Pod exists: a warm handle's fetch and Accept, or, when KEDA started
//	        a handle Job for it (cold), its poll, the Job's Pod and Accept (the share up to the
//	        Job's creation is reported as keda, over the cold jobs only)
//	pod     -> the runner container is running (scheduling, the install init container, containerd)
//	runner  -> the first step is running in Gitea (runner start, SVID, gateway, first report)
//
// The test observes each itself: /jsz polled every 50 ms, watches on Jobs and
// Pods (the arrival of the first event showing the object or the state),
// Gitea's jobs API polled every 100 ms. GDR_BENCH_SPIRE_SYNC sets the SPIRE
// agent's sync interval (SPIRE's default and most: 5 s), which bounds how
// long a workload-api executor waits for its SVID. The counts are fixed, so
// run it once:
//
//	go test -tags e2e -run '^$' -bench E2EClusterPickup -benchtime 1x -timeout 90m ./deploy/
//	GDR_BENCH_VARIANT=minted/channel go test -tags e2e -run '^$' -bench E2EClusterPickup -benchtime 1x -timeout 60m ./deploy/
//	GDR_BENCH_SPIRE_SYNC=1s go test -tags e2e -run '^$' -bench 'E2EClusterPickup/workload-api' -benchtime 1x ./deploy/
func BenchmarkE2EClusterPickup(b *testing.B) {
	for _, v := range []struct {
		name string
		opts installOptions
	}{
		{"minted/channel", installOptions{}},
		{"workload-api/channel", installOptions{podIdentity: backend.PodIdentityWorkloadAPI}},
		{"minted/default-queue", installOptions{defaultWebhookQueue: true}},
		{"minted/channel/no-volume", installOptions{podTemplate: withoutVolumes}},
		{"minted/channel/no-linger", installOptions{handleEnv: map[string]string{"GDR_LINGER": "0s"}}},
		// The jobs on the pool build (linux's template with the build capability): the cost of
		// the BuildKit sidecar's start and startup probe before the job's runner.
		{"minted/channel/build", installOptions{build: true}},
	} {
		// -bench cannot pick minted/channel alone: its name is a prefix of the others'.
		if only := os.Getenv("GDR_BENCH_VARIANT"); only != "" && only != v.name {
			continue
		}
		b.Run(v.name, func(b *testing.B) { benchClusterPickup(b, v.name, v.opts) })
	}
}

// benchCount is the count the variable name sets (def when unset), failing
// the benchmark when it is not a whole number of at least atLeast.
func benchCount(b *testing.B, name string, def, atLeast int) int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < atLeast {
		b.Fatalf("%s %q: want a count of at least %d", name, v, atLeast)
	}
	return n
}

// withoutVolumes is the pool linux's template without its /tmp emptyDir, the
// runner's root filesystem writable instead: a Pod with no volume at all
// skips the kubelet's wait for its volumes (polled every 300 ms), the cost
// this variant measures against the shipped template.
func withoutVolumes(spec map[string]any) {
	delete(spec, "volumes")
	containers, _ := spec["containers"].([]any)
	for _, c := range containers {
		c := c.(map[string]any)
		delete(c, "volumeMounts")
		if sc, ok := c["securityContext"].(map[string]any); ok {
			sc["readOnlyRootFilesystem"] = false
		}
	}
}

func benchClusterPickup(b *testing.B, variant string, o installOptions) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	if v := os.Getenv("GDR_BENCH_SPIRE_SYNC"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("GDR_BENCH_SPIRE_SYNC: %v", err)
		}
		o.spireSync = d
	}
	n := benchCount(b, "GDR_BENCH_JOBS", 10, 1)
	lone := benchCount(b, "GDR_BENCH_LONE", 3, 0)
	idle := benchCount(b, "GDR_BENCH_IDLE", 5, 0)
	in := installKEDAWith(ctx, b, o)
	label := "ubuntu-latest" // the pool linux's
	if o.build {
		label = "build"
	}
	repo := in.g.CreateRepo(b, "bench")
	floor := startFloor(ctx, b, in.g)
	seen := newSightings()
	go seen.pollQueue(ctx, in.monitor)
	go seen.watchJobs(ctx, b, in)
	go seen.watchPods(ctx, b, in)

	// details are the per-job lines, logged after the summary: the testing
	// package keeps only a benchmark's first 10 lines of log.
	var details []string
	b.ResetTimer()
	single := measureSeries(ctx, b, in, repo, label, floor, seen, "s", n, nil, &details)
	quiet := func() { in.noHandleRunning(ctx, b) }
	loneJobs := measureSeries(ctx, b, in, repo, label, floor, seen, "l", lone, quiet, &details)
	atZero := func() { in.waitZero(ctx, b, 10*time.Minute) }
	fromIdle := measureSeries(ctx, b, in, repo, label, floor, seen, "i", idle, atZero, &details)

	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("b%d", i)
	}
	pushed := pushWithTwins(b, in, repo, label, names...)
	started := in.waitRunning(ctx, b, repo, pushed, names...)
	var burst, burstTwin []time.Duration
	for _, name := range names {
		burst = append(burst, started[name].Sub(pushed))
		burstTwin = append(burstTwin, floor.claimed(b, twinJob(name)).Sub(pushed))
	}
	burstPods, burstRunners := seen.podsAfter(pushed)
	burstHandles := seen.jobsAfter(pushed)
	in.idle(ctx, b, repo, names...)
	// The floor alone: the same burst of twins, with no job of ours claimed,
	// started and reported at the same time.
	twinsOnly := make([]string, n)
	for i := range twinsOnly {
		twinsOnly[i] = fmt.Sprintf("f%d", i)
	}
	pushed = pushWithTwins(b, in, repo, "", twinsOnly...)
	var floorAlone []time.Duration
	for _, name := range twinsOnly {
		floorAlone = append(floorAlone, floor.claimed(b, twinJob(name)).Sub(pushed))
	}
	b.StopTimer()

	sec := func(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()) }
	for _, r := range []struct {
		name string
		s    series
	}{{"single", single}, {"lone", loneJobs}, {"idle", fromIdle}} {
		if len(r.s.total) == 0 {
			continue
		}
		over := overFloor(r.s.total, r.s.twin)
		b.Logf("cluster pickup %s/%s p50 %s p95 %s floor p50 %s over floor p50 %s p95 %s", variant, r.name,
			sec(p50(r.s.total)), sec(p95(r.s.total)), sec(p50(r.s.twin)), sec(p50(over)), sec(p95(over)))
		b.Logf("cluster pickup %s/%s split p50: queued %s handle %s pod %s runner %s; %d of %d cold (a new handle Job), their keda p50 %s", variant, r.name,
			sec(p50(r.s.queued)), sec(p50(r.s.handle)), sec(p50(r.s.pod)), sec(p50(r.s.runner)), len(r.s.keda), len(r.s.total), sec(p50(r.s.keda)))
	}
	burstOver := overFloor(burst, burstTwin)
	b.Logf("cluster pickup %s/burst p50 %s p95 %s floor p50 %s over floor p50 %s p95 %s; the floor alone (twins only, our idle polling running) p50 %s p95 %s",
		variant, sec(p50(burst)), sec(p95(burst)), sec(p50(burstTwin)), sec(p50(burstOver)), sec(p95(burstOver)), sec(p50(floorAlone)), sec(p95(floorAlone)))
	b.Logf("cluster pickup %s/burst from the push, p50 (p95): executor Pods exist %s (%s), their runners run %s (%s), first steps run %s (%s); %d executor Pods, %d new handle Jobs",
		variant, sec(p50(burstPods)), sec(p95(burstPods)), sec(p50(burstRunners)), sec(p95(burstRunners)), sec(p50(burst)), sec(p95(burst)), len(burstPods), burstHandles)
	for _, d := range details {
		b.Log(d)
	}
	for _, m := range []struct {
		unit string
		d    time.Duration
	}{
		{"single-p50-ms", p50(single.total)}, {"single-p95-ms", p95(single.total)}, {"single-floor-p50-ms", p50(single.twin)},
		{"single-over-floor-p95-ms", p95(overFloor(single.total, single.twin))},
		{"lone-p50-ms", p50(loneJobs.total)}, {"lone-p95-ms", p95(loneJobs.total)},
		{"lone-over-floor-p95-ms", p95(overFloor(loneJobs.total, loneJobs.twin))},
		{"idle-p50-ms", p50(fromIdle.total)}, {"idle-over-floor-p50-ms", p50(overFloor(fromIdle.total, fromIdle.twin))},
		{"idle-over-floor-max-ms", slices.Max(append(overFloor(fromIdle.total, fromIdle.twin), 0))},
		{"burst-p50-ms", p50(burst)}, {"burst-p95-ms", p95(burst)}, {"burst-floor-p50-ms", p50(burstTwin)},
		{"burst-over-floor-p95-ms", p95(burstOver)}, {"burst-floor-alone-p50-ms", p50(floorAlone)},
	} {
		b.ReportMetric(float64(m.d.Milliseconds()), m.unit)
	}
}

// series is what measureSeries saw of its jobs, one entry per job (keda:
// the cold jobs only).
type series struct {
	total, twin, queued, keda, handle, pod, runner []time.Duration
}

// measureSeries pushes count jobs named prefix<i> one after another (with
// their twins), each once the one before has ended and its executor Pod is
// gone and, if before is not nil, once before returns; it appends a line per
// job to details.
func measureSeries(ctx context.Context, b *testing.B, in *installation, repo, label string, floor *floorLoop, seen *sightings,
	prefix string, count int, before func(), details *[]string) series {
	var s series
	for i := range count {
		if before != nil {
			b.StopTimer()
			before()
			b.StartTimer()
		}
		name := fmt.Sprintf("%s%d", prefix, i)
		pushed := pushWithTwins(b, in, repo, label, name)
		started := in.waitRunning(ctx, b, repo, pushed, name)[name]
		q, j, p, r := seen.after(pushed)
		if q.IsZero() || p.IsZero() || r.IsZero() {
			b.Fatalf("job %s: a step went unseen (queued %v, Pod %v, running %v)", name, q, p, r)
		}
		// Cold: KEDA started a handle Job between the queueing and the executor Pod.
		how := "warm"
		if !j.IsZero() && j.Before(p) {
			how = "cold, keda " + j.Sub(q).Round(time.Millisecond).String()
			s.keda = append(s.keda, j.Sub(q))
		}
		s.total = append(s.total, started.Sub(pushed))
		s.twin = append(s.twin, floor.claimed(b, twinJob(name)).Sub(pushed))
		s.queued = append(s.queued, q.Sub(pushed))
		s.handle = append(s.handle, p.Sub(q))
		s.pod = append(s.pod, r.Sub(p))
		s.runner = append(s.runner, started.Sub(r))
		*details = append(*details, fmt.Sprintf("%s: total %v (floor %v) = queued %v + handle %v (%s) + pod %v + runner %v", name,
			s.total[i].Round(time.Millisecond), s.twin[i].Round(time.Millisecond), s.queued[i].Round(time.Millisecond),
			s.handle[i].Round(time.Millisecond), how, s.pod[i].Round(time.Millisecond), s.runner[i].Round(time.Millisecond)))
		in.idle(ctx, b, repo, name)
	}
	return s
}

// overFloor is each job's time minus its own twin's: the pairs share one
// push, so Gitea's own variation (its queue, its database) cancels out.
func overFloor(total, twin []time.Duration) []time.Duration {
	out := make([]time.Duration, len(total))
	for i := range total {
		out[i] = total[i] - twin[i]
	}
	return out
}

// noHandleRunning waits until no handle Job's Pod runs (the lingering ones
// ended), at most LingerMax and a margin.
func (in *installation) noHandleRunning(ctx context.Context, tb testing.TB) {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Minute); len(in.runningHandles(ctx, tb)) > 0; time.Sleep(time.Second) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			tb.Fatalf("handles still running 10 minutes on: %v", in.runningHandles(ctx, tb))
		}
	}
}

// twinLabel is the label of the twin jobs (no pool serves it), twinJob the
// name of a job's twin.
const twinLabel = "gdr-bench-twin"

func twinJob(job string) string { return "twin-" + job }

// pushWithTwins pushes one workflow with the jobs names (one `sleep 1` step
// each, runs-on label; none with label "") and each one's twin, and returns
// when the push returned.
func pushWithTwins(tb testing.TB, in *installation, repo, label string, names ...string) time.Time {
	tb.Helper()
	var w strings.Builder
	w.WriteString("on: push\njobs:\n")
	for _, name := range names {
		if label != "" {
			fmt.Fprintf(&w, "  %s:\n    runs-on: %s\n    steps:\n      - run: sleep 1\n", name, label)
		}
		fmt.Fprintf(&w, "  %s:\n    runs-on: %s\n    steps:\n      - run: \"true\"\n", twinJob(name), twinLabel)
	}
	in.g.PushWorkflow(tb, repo, ".gitea/workflows/bench.yml", w.String())
	return time.Now()
}

// waitRunning waits until each job of names has its first step running in
// Gitea (polling every 100 ms, at most 3 minutes after pushed) and returns
// when each was first seen so.
func (in *installation) waitRunning(ctx context.Context, tb testing.TB, repo string, pushed time.Time, names ...string) map[string]time.Time {
	tb.Helper()
	return in.waitRunningWithin(ctx, tb, repo, pushed, 3*time.Minute, 100*time.Millisecond, names...)
}

// waitRunningWithin is waitRunning at most within after pushed, polling
// every poll (Gitea's jobs API, 50 jobs a page: a large burst's poll costs
// Gitea a call per page).
func (in *installation) waitRunningWithin(ctx context.Context, tb testing.TB, repo string, pushed time.Time, within, poll time.Duration, names ...string) map[string]time.Time {
	tb.Helper()
	started := map[string]time.Time{}
	for deadline := pushed.Add(within); len(started) < len(names); time.Sleep(poll) {
		now := time.Now()
		for _, j := range in.g.Jobs(tb, repo) {
			if _, ok := started[j.Name]; !ok && slices.Contains(names, j.Name) && stepRunning(j) {
				started[j.Name] = now
			}
		}
		if len(started) < len(names) && (now.After(deadline) || ctx.Err() != nil) {
			in.dump(ctx, tb)
			tb.Fatalf("jobs running %v after their push: %d of %d", within, len(started), len(names))
		}
	}
	return started
}

// idle waits until the jobs names have completed and no executor Pod is
// left, so that the next push meets an idle installation.
func (in *installation) idle(ctx context.Context, tb testing.TB, repo string, names ...string) {
	tb.Helper()
	in.idleWithin(ctx, tb, repo, 3*time.Minute, names...)
}

// idleWithin is idle with each job given within to complete (the executor
// Pods then two minutes to go).
func (in *installation) idleWithin(ctx context.Context, tb testing.TB, repo string, within time.Duration, names ...string) {
	tb.Helper()
	for _, name := range names {
		in.waitCompleted(ctx, tb, repo, name, within)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		pods, err := in.cs.CoreV1().Pods(jobsNamespace).List(ctx, metav1.ListOptions{LabelSelector: executorSelector})
		if err != nil {
			tb.Fatal(err)
		}
		if len(pods.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("executor Pods left after jobs %v: %d", names, len(pods.Items))
		}
	}
}

// floorLoop is a bare FetchTask loop, Gitea's floor: a runner of its own on
// twinLabel that claims and at once finalizes every twin job.
type floorLoop struct {
	mu      sync.Mutex
	claims  map[string]time.Time // by job name
	changed chan struct{}
}

// startFloor registers the loop's runner and starts it until ctx ends. It
// polls every 50 ms, and again at once after a claim (a burst's twins are
// claimed one FetchTask each).
func startFloor(ctx context.Context, tb testing.TB, g *giteaenv.Server) *floorLoop {
	tb.Helper()
	hc := &http.Client{Timeout: 30 * time.Second}
	creds, err := gitea.Register(ctx, g.URL, hc, gitea.Registration{
		Token: g.RegistrationToken(tb), Name: "bench-floor", Labels: []string{twinLabel}})
	if err != nil {
		tb.Fatal(err)
	}
	client, err := gitea.NewClient(g.URL, hc, creds)
	if err != nil {
		tb.Fatal(err)
	}
	if err := client.Declare(ctx, []string{twinLabel}); err != nil {
		tb.Fatal(err)
	}
	f := &floorLoop{claims: map[string]time.Time{}, changed: make(chan struct{})}
	tasks := gitea.TaskState{Client: client}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			task, err := client.FetchTask(ctx)
			if err == nil && task != nil {
				at := time.Now()
				f.mu.Lock()
				f.claims[task.GetContext().GetFields()["job"].GetStringValue()] = at
				close(f.changed)
				f.changed = make(chan struct{})
				f.mu.Unlock()
				_ = tasks.Finalize(ctx, task.GetId(), runnerv1.Result_RESULT_SUCCESS, "cluster pickup floor: claimed, not run")
				continue
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	tb.Cleanup(func() { <-done })
	return f
}

// claimed is when job was claimed by the loop, waiting at most a minute.
func (f *floorLoop) claimed(tb testing.TB, job string) time.Time {
	tb.Helper()
	deadline := time.After(time.Minute)
	for {
		f.mu.Lock()
		at, changed := f.claims[job], f.changed
		f.mu.Unlock()
		if !at.IsZero() {
			return at
		}
		select {
		case <-changed:
		case <-deadline:
			tb.Fatalf("%s was never claimed by the floor loop", job)
		}
	}
}

// sightings are the times the benchmark saw each step, in order.
type sightings struct {
	mu      sync.Mutex
	queued  []time.Time          // /jsz: the stream stored a message (the server's time)
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

// podsAfter returns, for every executor Pod first seen at or after t0, how
// long after t0 it was first seen and its runner first seen running (the
// latter for those seen running).
func (s *sightings) podsAfter(t0 time.Time) (created, running []time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, t := range s.pods {
		if t.Before(t0) {
			continue
		}
		created = append(created, t.Sub(t0))
		if r, ok := s.running[name]; ok {
			running = append(running, r.Sub(t0))
		}
	}
	return created, running
}

// jobsAfter counts the handle Jobs first seen at or after t0.
func (s *sightings) jobsAfter(t0 time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, t := range s.jobs {
		if !t.Before(t0) {
			n++
		}
	}
	return n
}

// pollQueue polls nats-server's /jsz every 50 ms and notes, as each
// assignment's queueing, the server's time of storing the stream's last
// message whenever it changes: a warm handle takes and acknowledges a
// message between two polls, which the consumer's counts then never show.
func (s *sightings) pollQueue(ctx context.Context, monitor string) {
	var prev time.Time
	for ctx.Err() == nil {
		c, _, err := jetstreamenv.MonitoredConsumer(ctx, monitor, "CI_RUNNER", "pod")
		if err == nil && !c.StreamLast.IsZero() && !c.StreamLast.Equal(prev) {
			s.mu.Lock()
			s.queued = append(s.queued, c.StreamLast)
			s.mu.Unlock()
			prev = c.StreamLast
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
