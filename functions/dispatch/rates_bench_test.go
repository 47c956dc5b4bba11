//go:build e2e

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/callcount"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// jobsPerWorkflow is how many jobs one workflow file of the claim-rate
// benchmark holds; a push of n jobs writes n/jobsPerWorkflow files in one
// commit (one run each).
const jobsPerWorkflow = 100

// BenchmarkE2EClaimRate measures how fast dispatch claims the tasks of a
// queue of n jobs in a real Gitea 1.27.3 (default queue, SQLite), and what
// it asks of Gitea doing it, side by side with the floor, for each n of
// GDR_BENCH_JOBS (default 100,1000):
//
//   - floor: a bare loop of FetchTask calls with the raw Connect client
//     (the pool's registration, no payload store, no queue, no signing)
//     until it holds n tasks;
//   - dispatch: dispatch serve's own polling (service.rounds.Poll with
//     the configured cadence, defaults: 500 ms idle, 200 ms busy) and its
//     webhook receiver (Gitea's system webhook for workflow_job), each
//     claimed task stored sealed in the JetStream KV bucket and its signed
//     assignment published to the embedded JetStream, until n assignments
//     are on ci.assignment.process.
//
// Each path gets its own n jobs, pushed in one commit (n/100 workflow files
// of 100 jobs) and waited for until Gitea lists all n as queued, plus 3 s
// (the default queue's backoff before a job is fetchable); only then does
// the claimer start, so the rate is the claims', not Gitea's job creation.
// The floor's tasks are cancelled (CancelRun) before dispatch's are pushed.
// Every call dispatch and the floor make to Gitea goes through a counting
// transport (callcount); the webhook deliveries Gitea sends are counted by
// event and action over the whole path (push to the end of the claims, plus
// 5 s), before dispatch's phase too (answered 202 without a round until the
// claims start, so that no round claims before the queue is full). Gitea's
// CPU (utime+stime of its process) is read over each claim window.
//
// A third part, idle, runs dispatch serve's polling on a fresh Gitea with no
// job for GDR_BENCH_IDLE_WINDOW (default 60 s) and counts its calls: what an
// idle pool costs Gitea per hour.
//
//	CI=true go test -tags e2e -run '^$' -bench E2EClaimRate -benchtime 1x -timeout 60m ./functions/dispatch/
func BenchmarkE2EClaimRate(b *testing.B) {
	sizes := []int{100, 1000}
	if v := os.Getenv("GDR_BENCH_JOBS"); v != "" {
		sizes = nil
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("GDR_BENCH_JOBS: %q is not a positive number", f)
			}
			sizes = append(sizes, n)
		}
	}
	window := 60 * time.Second
	if v := os.Getenv("GDR_BENCH_IDLE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("GDR_BENCH_IDLE_WINDOW: %v", err)
		}
		window = d
	}
	var report []string
	if window > 0 {
		b.Run("idle", func(b *testing.B) { report = append(report, idleCalls(b, window)...) })
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("jobs=%d", n), func(b *testing.B) { report = append(report, claimRate(b, n)...) })
	}
	fmt.Println(strings.Join(report, "\n"))
}

// rateEnv is one Gitea, NATS and dispatch service for the claim-rate
// benchmark, with counters on dispatch's and the floor's calls to Gitea and
// on the webhook deliveries Gitea sends.
type rateEnv struct {
	*e2e
	calls, floorCalls, hooks callcount.Counter
	// armed: webhook deliveries reach dispatch's receiver (else they are
	// counted and answered 202 only).
	armed atomic.Bool
	raw   func(ctx context.Context) (*runnerv1.Task, error)
}

func newRateEnv(b *testing.B, capacity int) *rateEnv {
	b.Helper()
	r := &rateEnv{}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: r.calls.Transport(nil)}
	// The keep-alive at its default (1m): the claims take less, so no
	// waiting task is due during them.
	r.e2e = setupClient(b, capacity, giteaenv.Options{}, hc, map[string]string{"GDR_KEEPALIVE": "1m"})
	if r.svc.cadence == nil {
		b.Fatal("dispatch serve has no cadence: it would not poll")
	}
	inner := r.svc.handler()
	srv := httptest.NewServer(r.hooks.Handler(webhookKind, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !r.armed.Load() {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		inner.ServeHTTP(w, req)
	})))
	b.Cleanup(srv.Close)
	r.gitea.AddSystemWebhook(b, srv.URL+"/webhook", webhookSecret)
	creds, err := gitea.FileStore{Path: r.cfg.pools[0].Credentials}.Load()
	if err != nil {
		b.Fatal(err)
	}
	client := rawRunnerClient(r.gitea.URL, &http.Client{Timeout: 30 * time.Second, Transport: r.floorCalls.Transport(nil)}, creds)
	r.raw = func(ctx context.Context) (*runnerv1.Task, error) {
		res, err := client.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetTask(), nil
	}
	return r
}

// webhookKind names a delivery by its event and action (workflow_job/queued,
// workflow_job/in_progress, ...), leaving its body for the receiver.
func webhookKind(r *http.Request) string {
	body, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var d struct {
		Action string `json:"action"`
	}
	if err != nil || json.Unmarshal(body, &d) != nil {
		d.Action = "?"
	}
	return r.Header.Get("X-Gitea-Event") + "/" + d.Action
}

// queue pushes n jobs (named <tag>0000 ...) in one commit and waits until
// Gitea lists n jobs of the tag as queued, then 3 s more; it returns the
// runs they are in and how long the push and the wait took.
func (r *rateEnv) queue(b *testing.B, n int, tag string) (runs []int64, push, queued time.Duration) {
	b.Helper()
	files := map[string]string{}
	for f := 0; f*jobsPerWorkflow < n; f++ {
		var jobs []string
		for j := f * jobsPerWorkflow; j < min(n, (f+1)*jobsPerWorkflow); j++ {
			jobs = append(jobs, fmt.Sprintf("%s%04d", tag, j))
		}
		files[fmt.Sprintf(".gitea/workflows/w%02d.yml", f)] = workflow(jobs...)
	}
	start := time.Now()
	r.gitea.PushFiles(b, r.repo, files)
	push = time.Since(start)
	deadline := time.Now().Add(10 * time.Minute)
	for {
		seen := map[int64]bool{}
		count := 0
		for _, j := range r.gitea.Jobs(b, r.repo) {
			if strings.HasPrefix(j.Name, tag) && j.Status == "queued" {
				count++
				seen[j.RunID] = true
			}
		}
		if count >= n {
			for id := range seen {
				runs = append(runs, id)
			}
			slices.Sort(runs)
			queued = time.Since(start)
			time.Sleep(3 * time.Second) // the default queue's backoff before a job is fetchable
			return runs, push, queued
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d jobs %s* queued after %v, want %d", count, tag, time.Since(start), n)
		}
		time.Sleep(time.Second)
	}
}

// claimWindow is what one claimer did in its window.
type claimWindow struct {
	n       int
	elapsed time.Duration
	calls   map[string]int64
	ticks   int64 // Gitea's CPU over the window, in clock ticks
	load    string
}

func (w claimWindow) rate() float64 { return float64(w.n) / w.elapsed.Seconds() }

// perTask is calls of name per claimed task.
func (w claimWindow) perTask(name string) float64 { return float64(w.calls[name]) / float64(w.n) }

func (w claimWindow) cpuPerTask() float64 {
	return float64(w.ticks) * 1000 / float64(clkTck()) / float64(w.n)
}

func (w claimWindow) String() string {
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range w.calls {
			if !yield(k) {
				return
			}
		}
	})
	var parts []string
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("%s %d (%.3f/task)", k, w.calls[k], w.perTask(k)))
	}
	return fmt.Sprintf("%d tasks in %.2f s = %.1f claims/s; Gitea calls: %s; Gitea CPU %.1f ms/task (%.0f %% of a core); load %s",
		w.n, w.elapsed.Seconds(), w.rate(), strings.Join(parts, ", "), w.cpuPerTask(),
		float64(w.ticks)*100/float64(clkTck())/w.elapsed.Seconds(), w.load)
}

func claimRate(b *testing.B, n int) []string {
	// Room for more than n: a round ends as a pool's that is not full
	// does, with the FetchTask that finds no task.
	r := newRateEnv(b, n+10)
	pid := r.gitea.PID()
	ctx := context.Background()
	var out []string

	// The floor.
	hooks0 := r.hooks.Counts()
	runs, push, queued := r.queue(b, n, "f")
	out = append(out, fmt.Sprintf("jobs=%d floor: push of %d jobs (%d runs) %.1f s, all queued after %.1f s", n, n, len(runs), push.Seconds(), queued.Seconds()))
	calls0 := r.floorCalls.Counts()
	cpu0 := mustCPU(b, pid)
	start, got := time.Now(), 0
	for got < n {
		task, err := r.raw(ctx)
		if err != nil {
			b.Fatalf("floor: FetchTask after %d tasks: %v", got, err)
		}
		if task == nil {
			if time.Since(start) > 5*time.Minute {
				b.Fatalf("floor: %d tasks of %d after %v", got, n, time.Since(start))
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		got++
	}
	floor := claimWindow{n: n, elapsed: time.Since(start), calls: callcount.Since(r.floorCalls.Counts(), calls0),
		ticks: mustCPU(b, pid).self - cpu0.self, load: loadavg()}
	time.Sleep(5 * time.Second) // the in_progress deliveries of the last claims
	out = append(out, fmt.Sprintf("jobs=%d floor: %s; webhooks sent over the phase %v", n, floor, callcount.Since(r.hooks.Counts(), hooks0)))
	for _, id := range runs {
		r.gitea.CancelRun(b, r.repo, id)
	}
	time.Sleep(5 * time.Second)

	// dispatch serve.
	hooks0 = r.hooks.Counts()
	runs, push, queued = r.queue(b, n, "d")
	out = append(out, fmt.Sprintf("jobs=%d dispatch: push of %d jobs (%d runs) %.1f s, all queued after %.1f s", n, n, len(runs), push.Seconds(), queued.Seconds()))
	var published atomic.Int64
	done := make(chan struct{})
	sub, err := r.nc.Subscribe(assignmentqueue.Subject(taskassignment.BackendProcess), func(*nats.Msg) {
		if published.Add(1) == int64(n) {
			close(done)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	pollCtx, stop := context.WithCancel(ctx)
	var loop sync.WaitGroup
	calls0 = r.calls.Counts()
	cpu0 = mustCPU(b, pid)
	start = time.Now()
	r.armed.Store(true)
	loop.Go(func() { r.svc.rounds.Poll(pollCtx, r.svc.pools...) })
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("dispatch: %d assignments of %d published after %v", published.Load(), n, time.Since(start))
	}
	disp := claimWindow{n: n, elapsed: time.Since(start), calls: callcount.Since(r.calls.Counts(), calls0),
		ticks: mustCPU(b, pid).self - cpu0.self, load: loadavg()}
	time.Sleep(5 * time.Second)
	stop()
	loop.Wait()
	out = append(out, fmt.Sprintf("jobs=%d dispatch: %s; webhooks sent over the phase %v (failed %v)", n, disp,
		callcount.Since(r.hooks.Counts(), hooks0), r.hooks.Failed()))
	out = append(out, fmt.Sprintf("jobs=%d dispatch/floor claims per second: %.2f", n, disp.rate()/floor.rate()))
	if f := r.calls.Failed(); len(f) > 0 {
		b.Errorf("dispatch: failed calls to Gitea: %v", f)
	}
	b.ReportMetric(floor.rate(), "floor-claims/s")
	b.ReportMetric(disp.rate(), "dispatch-claims/s")
	b.ReportMetric(disp.perTask("FetchTask"), "dispatch-FetchTask/task")
	return out
}

// idleCalls runs dispatch serve's polling with no job queued for window and
// reports its calls to Gitea, per hour.
func idleCalls(b *testing.B, window time.Duration) []string {
	r := newRateEnv(b, 5)
	r.armed.Store(true)
	pid := r.gitea.PID()
	ctx, stop := context.WithCancel(context.Background())
	var loop sync.WaitGroup
	loop.Go(func() { r.svc.rounds.Poll(ctx, r.svc.pools...) })
	defer func() {
		stop()
		loop.Wait()
	}()
	time.Sleep(5 * time.Second) // the first round (Declare) and start-up work
	calls0, cpu0, start := r.calls.Counts(), mustCPU(b, pid), time.Now()
	time.Sleep(window)
	calls, ticks, elapsed := callcount.Since(r.calls.Counts(), calls0), mustCPU(b, pid).self-cpu0.self, time.Since(start)
	perHour := map[string]float64{}
	total := 0.0
	for k, v := range calls {
		perHour[k] = float64(v) * float64(time.Hour) / float64(elapsed)
		total += perHour[k]
	}
	b.ReportMetric(total, "idle-calls/h")
	return []string{fmt.Sprintf("idle: %v in %.1f s = %.0f calls/h (%v); Gitea CPU %.2f %% of a core; load %s",
		calls, elapsed.Seconds(), total, perHour, float64(ticks)*100/float64(clkTck())/elapsed.Seconds(), loadavg())}
}

func mustCPU(b *testing.B, pid int) cpuTicks {
	b.Helper()
	c, err := procCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return c
}
