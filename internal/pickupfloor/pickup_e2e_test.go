//go:build e2e

package pickupfloor

import (
	"bufio"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// BenchmarkE2EPickupFloor measures pickup against one real Gitea 1.27.3 per
// queue type (its default queue, and [queue] TYPE=channel): b.N jobs one
// after another through each of three paths, each path with its own runner
// registration, label and repository, the paths one after another:
//
//   - floor: a bare loop calling FetchTask every 50 ms (shared/gitea's
//     client, sending the tasks version back as Gitea's own runner does);
//     the job is picked up when FetchTask returns it. Nothing can claim a
//     job sooner than Gitea makes it fetchable, so this is the floor.
//   - local: local mode (functions/local, its defaults but the label); the
//     job is picked up when its executor is created (the "job running"
//     line: handle's Worker.Accept created the process).
//   - dispatch: dispatch serve (functions/dispatch, its defaults, with
//     Gitea's workflow_job webhook); the job is picked up when its
//     assignment arrives on ci.assignment.process (what handle consumes).
//
// Every latency starts when the push call (a commit through the contents
// API) returned; each push comes after a pause, partly random (see
// pushStep). Each job is pushed once the one before is picked up
// (floor, dispatch: then failed in Gitea through the claiming registration)
// or has completed (local, so a slot is free). For local it also reports
// push -> claimed (the "job picked up" line) and push -> first step running
// (Gitea's REST API, polled every 50 ms from the executor's creation on, so
// the polling loads Gitea only after the pickup); for dispatch push -> the
// webhook received and push -> claimed (its debug lines). Go runs each path
// once with b.N = 1 first: a warm-up, not reported.
//
// Every local and dispatch push also carries a twin job for a second bare
// 50 ms loop (see twins): the floor measured on the very same pushes.
//
// It prints per queue and path
//
//	pickup <path> <queue> p50 <s> p95 <s> floor p50 <s>
//
// and below it the twins' floor for the same pushes with the p50 and p95
// of each job's pickup minus its twin's, where the time went, and the
// slowest job's trace.
// GDR_BENCH_LOCAL_ENV and GDR_BENCH_DISPATCH_ENV add variables (a=b,c=d) to
// the two processes, GDR_BENCH_LOCAL_BIN and GDR_BENCH_DISPATCH_BIN run
// other builds of them (another commit's), GDR_BENCH_GITEA_INI is added to
// Gitea's app.ini (with \n for newlines), GDR_BENCH_LOGS keeps their
// logs in that directory, and GDR_BENCH_TRACE=1 prints every job's trace.
//
//	go test -tags e2e -run '^$' -bench E2EPickupFloor -benchtime 20x -timeout 60m ./internal/pickupfloor/
func BenchmarkE2EPickupFloor(b *testing.B) {
	bins := buildFunctions(b)
	var report []string
	for _, q := range []struct {
		name    string
		channel bool
	}{{"default", false}, {"channel", true}} {
		env := newEnv(b, q.name, q.channel, bins)
		results := map[string][]sample{}
		for _, path := range []string{"floor", "local", "dispatch"} {
			b.Run(q.name+"/"+path, func(b *testing.B) {
				load := loadavg()
				var s []sample
				switch path {
				case "floor":
					s = env.floor(b, b.N)
				case "local":
					s = env.local(b, b.N)
				default:
					s = env.dispatch(b, b.N)
				}
				if b.N > 1 {
					results[path] = s
					report = append(report, fmt.Sprintf("# %s/%s: load average %s at start, %s at end", q.name, path, load, loadavg()))
				}
			})
		}
		if env.stopTwins != nil {
			env.stopTwins()
		}
		env.gitea.Stop(b)
		report = append(report, summarize(q.name, results)...)
	}
	fmt.Println(strings.Join(report, "\n"))
}

// sample is one job's way through a path; every time is the wall clock of
// this machine (processes' log lines carry theirs, in ms), zero when not seen.
type sample struct {
	job                                                string
	task                                               int64
	pushed                                             time.Time // the push call returned
	webhook, claimed, published, created, step, pickup time.Time
	// twin is when the bare 50 ms FetchTask loop claimed the twin job of the
	// same push (see env.twins): Gitea's floor for this very push.
	twin time.Time
	// passes are local mode's recover passes between push and claim.
	passes []time.Time
}

func (s sample) since(t time.Time) time.Duration {
	if t.IsZero() {
		return -1
	}
	return t.Sub(s.pushed)
}

func (s sample) trace() string {
	parts := []string{s.job, fmt.Sprintf("task %d", s.task)}
	for _, p := range []struct {
		name string
		at   time.Time
	}{{"twin", s.twin}, {"webhook", s.webhook}, {"claimed", s.claimed}, {"published", s.published}, {"created", s.created}, {"step", s.step}} {
		if !p.at.IsZero() {
			parts = append(parts, fmt.Sprintf("%s +%.3f s", p.name, s.since(p.at).Seconds()))
		}
	}
	for _, p := range s.passes {
		parts = append(parts, fmt.Sprintf("recover pass +%.3f s", s.since(p).Seconds()))
	}
	return strings.Join(parts, ", ")
}

// summarize returns the report lines of one queue type.
func summarize(queue string, results map[string][]sample) []string {
	floor := quantiles(results["floor"], func(s sample) time.Time { return s.pickup })
	out := []string{fmt.Sprintf("pickup floor %s p50 %.3f p95 %.3f", queue, floor.p50, floor.p95)}
	for _, path := range []string{"local", "dispatch"} {
		s := results[path]
		if len(s) == 0 {
			continue
		}
		q := quantiles(s, func(s sample) time.Time { return s.pickup })
		out = append(out, fmt.Sprintf("pickup %s %s p50 %.3f p95 %.3f floor p50 %.3f", path, queue, q.p50, q.p95, floor.p50))
		if tq := quantiles(s, func(s sample) time.Time { return s.twin }); tq.n > 0 {
			var diff []time.Duration
			for _, x := range s {
				if !x.twin.IsZero() {
					diff = append(diff, x.pickup.Sub(x.twin))
				}
			}
			slices.Sort(diff)
			out = append(out, fmt.Sprintf("  %s %s paired with its twins (the floor on the same pushes, %d): floor p50 %.3f p95 %.3f; ours - twin p50 %+.3f p95 %+.3f",
				path, queue, tq.n, tq.p50, tq.p95, diff[len(diff)/2].Seconds(), diff[(len(diff)*95+99)/100-1].Seconds()))
		}
		split := []string{}
		for _, p := range []struct {
			name string
			at   func(sample) time.Time
		}{
			{"webhook", func(s sample) time.Time { return s.webhook }},
			{"claimed", func(s sample) time.Time { return s.claimed }},
			{"first step", func(s sample) time.Time { return s.step }},
		} {
			if q := quantiles(s, p.at); q.n > 0 {
				split = append(split, fmt.Sprintf("%s p50 %.3f p95 %.3f (%d)", p.name, q.p50, q.p95, q.n))
			}
		}
		var after []time.Duration
		for _, x := range s {
			if !x.claimed.IsZero() {
				after = append(after, x.pickup.Sub(x.claimed))
			}
		}
		if len(after) > 0 {
			slices.Sort(after)
			split = append(split, fmt.Sprintf("claimed -> picked up p50 %.3f max %.3f", after[len(after)/2].Seconds(), after[len(after)-1].Seconds()))
		}
		out = append(out, fmt.Sprintf("  %s %s: %s", path, queue, strings.Join(split, "; ")))
		if os.Getenv("GDR_BENCH_TRACE") != "" {
			for _, x := range s {
				out = append(out, "  # "+x.trace())
			}
		}
		slowest := slices.MaxFunc(s, func(a, b sample) int { return cmp.Compare(a.since(a.pickup), b.since(b.pickup)) })
		out = append(out, fmt.Sprintf("  %s %s slowest: %s", path, queue, slowest.trace()))
	}
	return out
}

type quantile struct {
	n        int
	p50, p95 float64 // seconds
}

// quantiles returns the upper median and the p95 (rank ceil(0.95 n)) of
// push -> at over the samples that saw at.
func quantiles(s []sample, at func(sample) time.Time) quantile {
	var d []time.Duration
	for _, x := range s {
		if t := at(x); !t.IsZero() {
			d = append(d, t.Sub(x.pushed))
		}
	}
	if len(d) == 0 {
		return quantile{}
	}
	slices.Sort(d)
	return quantile{n: len(d), p50: d[len(d)/2].Seconds(), p95: d[(len(d)*95+99)/100-1].Seconds()}
}

// binaries are the functions built once for the whole benchmark.
type binaries struct{ local, dispatch string }

func buildFunctions(b *testing.B) binaries {
	b.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		b.Fatal(err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	dir := b.TempDir()
	bins := binaries{local: filepath.Join(dir, "local"), dispatch: filepath.Join(dir, "dispatch")}
	for bin, pkg := range map[string]string{bins.local: "./functions/local", bins.dispatch: "./functions/dispatch"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return bins
}

// env is one Gitea and what the paths share across their runs.
type env struct {
	queue string
	gitea *giteaenv.Server
	token string // the registration token's file
	bins  binaries
	// repos, one per path, keep each path's job list short.
	repos map[string]string
	hc    *http.Client

	// dispatch's NATS, state and address stay for its runs: its
	// registration and the system webhook to it are made once.
	natsURL, dispatchState, dispatchAddr string
	nc                                   *nats.Conn
	webhookAdded                         bool
	// localHookAddr is local mode's webhook address with
	// GDR_BENCH_LOCAL_WEBHOOK, the same for its runs.
	localHookAddr  string
	localHookAdded bool
	// twins claims the twin job of every local and dispatch push, from the
	// first such push until stopTwins (the env's end: it outlives the
	// sub-benchmark that started it).
	twins     *twins
	stopTwins func()
}

const (
	webhookSecret = "pickup-bench-secret"
	trustDomain   = "bench.example.org"
)

var (
	payloadKey = base64.StdEncoding.EncodeToString([]byte("payload-key-material-0123456789a"))
	signingKey = base64.StdEncoding.EncodeToString([]byte("signing-key-material-0123456789a"))
)

func newEnv(b *testing.B, queue string, channel bool, bins binaries) *env {
	b.Helper()
	g := giteaenv.Start(b, giteaenv.Options{ChannelQueue: channel,
		ExtraINI: strings.ReplaceAll(os.Getenv("GDR_BENCH_GITEA_INI"), `\n`, "\n")})
	e := &env{queue: queue, gitea: g, bins: bins, repos: map[string]string{}, hc: &http.Client{Timeout: 30 * time.Second}}
	for _, p := range []string{"floor", "local", "dispatch"} {
		e.repos[p] = g.CreateRepo(b, p)
	}
	e.token = filepath.Join(b.TempDir(), "registration-token")
	if err := os.WriteFile(e.token, []byte(g.RegistrationToken(b)+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	_, e.natsURL = jetstreamenv.Start(b)
	e.nc, _ = jetstreamenv.Connect(b, e.natsURL)
	e.dispatchState = b.TempDir()
	e.dispatchAddr = freeAddr(b)
	e.localHookAddr = freeAddr(b)
	return e
}

// push commits a workflow of one job, name, on label, to path's repository,
// and returns when the call returned.
func (e *env) push(b *testing.B, path, name, label string) time.Time {
	b.Helper()
	return e.pushStep(b, path, name, label, "true")
}

// pushStep is push with the job's one step running step. It first pauses
// GDR_BENCH_PAUSE (default 2s) plus a random time up to GDR_BENCH_JITTER
// (default 2s). Gitea's default queue polls for work backing off from 50 ms
// to every 2 s once idle (modules/queue), so how soon it takes a push
// depends on the time since its last item: with the pause every path's
// pushes find it idle (its 2 s steps reached, whatever the path did in
// between: a job of local mode runs to its end first), and with the jitter
// at no fixed phase to those steps or to a poll interval, as pushes come.
func (e *env) pushStep(b *testing.B, path, name, label, step string) time.Time {
	b.Helper()
	pause := benchDuration(b, "GDR_BENCH_PAUSE", 2*time.Second)
	if jitter := benchDuration(b, "GDR_BENCH_JITTER", 2*time.Second); jitter > 0 {
		pause += rand.N(jitter)
	}
	time.Sleep(pause)
	workflow := "name: ci\non: [push]\njobs:\n  " + name + ":\n    runs-on: " + label + "\n    steps:\n      - run: " + strconv.Quote(step) + "\n"
	if path != "floor" {
		e.twinsStarted(b)
		workflow += "  " + twinJob(name) + ":\n    runs-on: " + twinLabel + "\n    steps:\n      - run: \"true\"\n"
	}
	e.gitea.PushWorkflow(b, e.repos[path], ".gitea/workflows/ci.yml", workflow)
	return time.Now()
}

// twinLabel is the label of the twin jobs, twinJob the name of a job's twin.
const twinLabel = "gdr-twin"

func twinJob(job string) string { return "twin-" + job }

// twins is a bare FetchTask loop polling every 50 ms, as the floor path's,
// for the twin jobs: every local and dispatch push carries a second job,
// on twinLabel, in the same workflow. Gitea creates a run's jobs in one
// transaction, so both become fetchable at the same moment, and the twin's
// claim is Gitea's floor for that very push: comparing each job with its
// twin takes out Gitea's own queue delay (0-2 s on its default queue),
// which varies more from one 20-job run to the next than the 0.15 s the
// comparison is after. The two claims may meet in Gitea's database
// (SQLite serializes writes): a few ms for whichever comes second.
type twins struct {
	mu      sync.Mutex
	claims  map[string]time.Time // by job name
	changed chan struct{}
}

// twinsStarted starts the twins' loop once per env; it runs until
// e.stopTwins.
func (e *env) twinsStarted(b *testing.B) {
	b.Helper()
	if e.twins != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	creds, err := gitea.Register(ctx, e.gitea.URL, e.hc, gitea.Registration{
		Token: e.gitea.RegistrationToken(b), Name: "floor-twin", Labels: []string{twinLabel}})
	if err != nil {
		b.Fatal(err)
	}
	client, err := gitea.NewClient(e.gitea.URL, e.hc, creds)
	if err != nil {
		b.Fatal(err)
	}
	if err := client.Declare(ctx, []string{twinLabel}); err != nil {
		b.Fatal(err)
	}
	tw := &twins{claims: map[string]time.Time{}, changed: make(chan struct{})}
	e.twins = tw
	done := make(chan struct{})
	tasks := gitea.TaskState{Client: client}
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			if task, err := client.FetchTask(ctx); err == nil && task != nil {
				at := time.Now()
				tw.mu.Lock()
				tw.claims[task.GetContext().GetFields()["job"].GetStringValue()] = at
				close(tw.changed)
				tw.changed = make(chan struct{})
				tw.mu.Unlock()
				_ = tasks.Finalize(ctx, task.GetId(), runnerv1.Result_RESULT_SUCCESS, "pickup floor twin: claimed, not run")
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	e.stopTwins = func() { cancel(); <-done }
}

// twin is when job's twin was claimed, waiting at most a minute.
func (e *env) twin(b *testing.B, job string) time.Time {
	b.Helper()
	deadline := time.After(time.Minute)
	for {
		e.twins.mu.Lock()
		at, changed := e.twins.claims[twinJob(job)], e.twins.changed
		e.twins.mu.Unlock()
		if !at.IsZero() {
			return at
		}
		select {
		case <-changed:
		case <-deadline:
			b.Fatalf("%s: its twin was never claimed", job)
		}
	}
}

// floor runs n jobs through a bare FetchTask loop polling every 50 ms.
func (e *env) floor(b *testing.B, n int) []sample {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	creds, err := gitea.Register(ctx, e.gitea.URL, e.hc, gitea.Registration{
		Token: e.gitea.RegistrationToken(b), Name: "floor", Labels: []string{"gdr-floor"}})
	if err != nil {
		b.Fatal(err)
	}
	client, err := gitea.NewClient(e.gitea.URL, e.hc, creds)
	if err != nil {
		b.Fatal(err)
	}
	if err := client.Declare(ctx, []string{"gdr-floor"}); err != nil {
		b.Fatal(err)
	}
	type claim struct {
		task *runnerv1.Task
		at   time.Time
	}
	claims := make(chan claim, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			task, err := client.FetchTask(ctx)
			if err == nil && task != nil {
				claims <- claim{task, time.Now()}
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	defer func() { cancel(); <-done }()
	tasks := gitea.TaskState{Client: client}
	var out []sample
	for i := range n {
		s := sample{job: fmt.Sprintf("floor-n%d-%d", n, i)}
		s.pushed = e.push(b, "floor", s.job, "gdr-floor")
		select {
		case c := <-claims:
			if job := c.task.GetContext().GetFields()["job"].GetStringValue(); job != s.job {
				b.Fatalf("claimed job %s, want %s", job, s.job)
			}
			s.task, s.claimed, s.pickup = c.task.GetId(), c.at, c.at
		case <-time.After(60 * time.Second):
			b.Fatalf("%s never claimed", s.job)
		}
		if err := tasks.Finalize(ctx, s.task, runnerv1.Result_RESULT_SUCCESS, "pickup floor: claimed, not run"); err != nil {
			b.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// local runs n jobs through local mode, started for this run with a state
// directory of its own. GDR_BENCH_LOCAL_BIN runs another build of it (one
// from before --log-format: its text lines are read); GDR_BENCH_LOCAL_STEP
// is the step's command (default true); GDR_BENCH_LOCAL_NEXT=running pushes
// the next job once this one's first step runs instead of once it
// completed (so jobs overlap and may wait for a slot);
// GDR_BENCH_LOCAL_WEBHOOK=1 serves Gitea's workflow_job webhook too
// (--webhook-addr, a system webhook to it).
func (e *env) local(b *testing.B, n int) []sample {
	bin, args := e.bins.local, []string{"--gitea-url", e.gitea.URL, "--registration-token-file", e.token,
		"--state-dir", b.TempDir(), "--gateway-addr", freeAddr(b), "--labels", "gdr-local"}
	if other := os.Getenv("GDR_BENCH_LOCAL_BIN"); other != "" {
		bin = other
	} else {
		args = append(args, "--log-format", "json")
	}
	vars := []string{"GDR_LOG_LEVEL=debug"}
	if os.Getenv("GDR_BENCH_LOCAL_WEBHOOK") != "" {
		args = append(args, "--webhook-addr", e.localHookAddr)
		vars = append(vars, "GDR_WEBHOOK_SECRET="+webhookSecret)
		if !e.localHookAdded {
			e.gitea.AddSystemWebhook(b, "http://"+e.localHookAddr+"/webhook", webhookSecret)
			e.localHookAdded = true
		}
	}
	step := cmp.Or(os.Getenv("GDR_BENCH_LOCAL_STEP"), "true")
	overlap := os.Getenv("GDR_BENCH_LOCAL_NEXT") == "running"
	lw := e.start(b, "local", bin, vars, benchEnv("GDR_BENCH_LOCAL_ENV"), args...)
	var out []sample
	for i := range n {
		s := sample{job: fmt.Sprintf("local-n%d-%d", n, i)}
		s.pushed = e.pushStep(b, "local", s.job, "gdr-local", step)
		// The executor is created (Worker.Accept's executor_created event;
		// "job running" is logged on the same event).
		task, created := lw.wait(b, s.job, "executor_created", 60*time.Second)
		s.task, s.created, s.pickup = task, created, created
		s.claimed = lw.first(task, "task claimed", "job picked up", "task claimed and queued")
		s.passes = lw.between("recover", s.pushed, s.claimed)
		s.step = e.waitJob(b, "local", s.job, func(j giteaenv.Job) bool {
			return len(j.Steps) > 0 && j.Steps[0].Status != "queued" && j.Steps[0].Status != ""
		}, 50*time.Millisecond)
		if !overlap {
			e.waitJob(b, "local", s.job, func(j giteaenv.Job) bool { return j.Status == "completed" }, 100*time.Millisecond)
		}
		s.twin = e.twin(b, s.job)
		out = append(out, s)
	}
	return out
}

// waitJob polls path's jobs every interval until job matches, and returns
// when it was seen.
func (e *env) waitJob(b *testing.B, path, job string, match func(giteaenv.Job) bool, interval time.Duration) time.Time {
	b.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, j := range e.gitea.Jobs(b, e.repos[path]) {
			if j.Name == job && match(j) {
				return time.Now()
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: never in the state waited for", job)
		}
		time.Sleep(interval)
	}
}

// dispatch runs n jobs through dispatch serve (one pool, process backend,
// capacity 1000) with Gitea's workflow_job webhook.
func (e *env) dispatch(b *testing.B, n int) []sample {
	ctx := context.Background()
	vars := e.dispatchVars(b)
	creds, err := gitea.FileStore{Path: filepath.Join(e.dispatchState, "bench.json")}.Load()
	if err != nil {
		b.Fatal(err)
	}
	client, err := gitea.NewClient(e.gitea.URL, e.hc, creds)
	if err != nil {
		b.Fatal(err)
	}
	tasks := gitea.TaskState{Client: client}

	seed, err := base64.StdEncoding.DecodeString(signingKey)
	if err != nil {
		b.Fatal(err)
	}
	signer, err := assignmentsig.NewSigner(secretkey.Key(seed))
	if err != nil {
		b.Fatal(err)
	}
	type pub struct {
		a  taskassignment.Assignment
		at time.Time
	}
	published := make(chan pub, 16)
	td := spiffeid.RequireTrustDomainFromString(trustDomain)
	sub, err := e.nc.Subscribe(assignmentqueue.Subject(taskassignment.BackendProcess), func(m *nats.Msg) {
		at := time.Now()
		data, err := signer.Open(m.Data)
		if err != nil {
			return
		}
		if a, err := taskassignment.Decode(data, td); err == nil {
			published <- pub{a, at}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	lw := e.start(b, "dispatch", cmp.Or(os.Getenv("GDR_BENCH_DISPATCH_BIN"), e.bins.dispatch), vars, benchEnv("GDR_BENCH_DISPATCH_ENV"), "serve")
	e.waitHTTP(b, "http://"+e.dispatchAddr+"/livez")
	if !e.webhookAdded {
		e.gitea.AddSystemWebhook(b, "http://"+e.dispatchAddr+"/webhook", webhookSecret)
		e.webhookAdded = true
	}
	var out []sample
	for i := range n {
		s := sample{job: fmt.Sprintf("dispatch-n%d-%d", n, i)}
		s.pushed = e.push(b, "dispatch", s.job, "gdr-dispatch")
	wait:
		for {
			select {
			case p := <-published:
				if p.a.Identity.Task != s.job {
					continue // a repeat of an earlier one
				}
				s.task, s.published, s.pickup = p.a.Task.ID, p.at, p.at
				break wait
			case <-time.After(60 * time.Second):
				b.Fatalf("%s never published", s.job)
			}
		}
		if err := tasks.Finalize(ctx, s.task, runnerv1.Result_RESULT_SUCCESS, "pickup floor: published, not run"); err != nil {
			b.Fatal(err)
		}
		s.claimed = lw.wait1(s.task, "task claimed", 5*time.Second)
		s.twin = e.twin(b, s.job)
		out = append(out, s)
	}
	// Which delivery was whose: Gitea's job IDs, asked once the pickups
	// are over.
	ids := map[string]int64{}
	for _, j := range e.gitea.Jobs(b, e.repos["dispatch"]) {
		ids[j.Name] = j.ID
	}
	for i := range out {
		out[i].webhook = lw.webhook(ids[out[i].job])
	}
	return out
}

func (e *env) waitHTTP(b *testing.B, url string) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := e.hc.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s never answered 200 (%v)", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// benchDuration is the duration in the variable name, def when it is unset.
func benchDuration(b *testing.B, name string, def time.Duration) time.Duration {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return d
}

// benchEnv reads a=b,c=d from the variable name.
func benchEnv(name string) []string {
	v := os.Getenv(name)
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// start runs bin with args, vars and extra in its environment, until the
// run ends, and watches its log lines (stdout and stderr).
func (e *env) start(b *testing.B, name, bin string, vars, extra []string, args ...string) *logWatch {
	b.Helper()
	lw, stop := e.startProc(b, name, bin, vars, extra, args...)
	b.Cleanup(stop)
	return lw
}

// startProc is start, but ending the process is left to the caller: stop
// sends SIGTERM, then SIGKILL after 10 s, and waits until its output is
// read; it may be called more than once.
func (e *env) startProc(b *testing.B, name, bin string, vars, extra []string, args ...string) (*logWatch, func()) {
	b.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), vars...), extra...)
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	_ = w.Close()
	var keep io.Writer = io.Discard
	if dir := os.Getenv("GDR_BENCH_LOGS"); dir != "" {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%s-%d.log", e.queue, name, time.Now().UnixNano())))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = f.Close() })
		keep = f
	}
	lw := newLogWatch()
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		lw.scan(r, keep)
	}()
	var once sync.Once
	return lw, func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			<-scanned
		})
	}
}

// logWatch records the first time each message was logged per task, from
// JSON log lines (slog's: time, msg, task, job).
type logWatch struct {
	mu      sync.Mutex
	byTask  map[int64]map[string]time.Time
	jobTask map[string]int64
	hooks   map[int64]time.Time // the first webhook line per Gitea job ID
	lines   []line              // those of no task
	changed chan struct{}
}

func newLogWatch() *logWatch {
	return &logWatch{byTask: map[int64]map[string]time.Time{}, jobTask: map[string]int64{}, hooks: map[int64]time.Time{}, changed: make(chan struct{})}
}

func (w *logWatch) scan(r io.Reader, keep io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		_, _ = keep.Write(append(line, '\n'))
		l, ok := parseLine(line)
		if !ok {
			continue
		}
		w.mu.Lock()
		switch {
		case l.Msg == webhookLine && l.JobID != 0:
			if _, ok := w.hooks[l.JobID]; !ok {
				w.hooks[l.JobID] = l.Time
			}
		case l.Task != 0:
			m := w.byTask[l.Task]
			if m == nil {
				m = map[string]time.Time{}
				w.byTask[l.Task] = m
			}
			if _, ok := m[l.Msg]; !ok {
				m[l.Msg] = l.Time
			}
			if l.Job != "" {
				w.jobTask[l.Job] = l.Task
			}
		default:
			w.lines = append(w.lines, l)
		}
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
	}
}

// line is what the benchmark reads of a log line.
type line struct {
	Time time.Time `json:"time"`
	Msg  string    `json:"msg"`
	Task int64     `json:"task"`
	Job  string    `json:"job"`
	// JobID is Gitea's job ID of a webhook delivery.
	JobID int64 `json:"job_id"`
	// Assignment names the task of a worker event: <pool>-<task ID>.
	Assignment string `json:"assignment"`
}

// parseLine reads a JSON line, or slog's text format (key=value, values
// quoted where needed).
func parseLine(data []byte) (line, bool) {
	var l line
	if json.Unmarshal(data, &l) != nil {
		rest := string(data)
		if !strings.HasPrefix(rest, "time=") {
			return l, false
		}
		for rest != "" {
			key, after, ok := strings.Cut(rest, "=")
			if !ok {
				break
			}
			var value string
			if strings.HasPrefix(after, `"`) {
				q, err := strconv.QuotedPrefix(after)
				if err != nil {
					break
				}
				value, _ = strconv.Unquote(q)
				after = after[len(q):]
			} else {
				value, after, _ = strings.Cut(after, " ")
			}
			rest = strings.TrimLeft(after, " ")
			switch key {
			case "time":
				l.Time, _ = time.Parse(time.RFC3339Nano, value)
			case "msg":
				l.Msg = value
			case "task":
				l.Task, _ = strconv.ParseInt(value, 10, 64)
			case "job":
				l.Job = value
			case "job_id":
				l.JobID, _ = strconv.ParseInt(value, 10, 64)
			case "assignment":
				l.Assignment = value
			}
		}
	}
	if l.Task == 0 && l.Assignment != "" {
		if _, id, err := taskassignment.ParseID(l.Assignment); err == nil {
			l.Task = id
		}
	}
	return l, !l.Time.IsZero()
}

// wait returns the task of job and when msg was first logged for it,
// waiting at most timeout.
func (w *logWatch) wait(b *testing.B, job, msg string, timeout time.Duration) (int64, time.Time) {
	b.Helper()
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		task, ok := w.jobTask[job]
		at := w.byTask[task][msg]
		changed := w.changed
		w.mu.Unlock()
		if ok && !at.IsZero() {
			return task, at
		}
		select {
		case <-changed:
		case <-deadline:
			b.Fatalf("%s: no %q line within %v", job, msg, timeout)
		}
	}
}

// wait1 is when msg was first logged for task, waiting at most timeout;
// zero if it was not.
func (w *logWatch) wait1(task int64, msg string, timeout time.Duration) time.Time {
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		at := w.byTask[task][msg]
		changed := w.changed
		w.mu.Unlock()
		if !at.IsZero() {
			return at
		}
		select {
		case <-changed:
		case <-deadline:
			return time.Time{}
		}
	}
}

// first is when the first of msgs that was logged for task was first
// logged, zero if none was.
func (w *logWatch) first(task int64, msgs ...string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range msgs {
		if at := w.byTask[task][m]; !at.IsZero() {
			return at
		}
	}
	return time.Time{}
}

// between is when msg (a line of no task) was logged after from and before
// to.
func (w *logWatch) between(msg string, from, to time.Time) []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []time.Time
	for _, l := range w.lines {
		if l.Msg == msg && l.Time.After(from) && l.Time.Before(to) {
			out = append(out, l.Time)
		}
	}
	return out
}

// webhookLine is dispatch's debug line for a delivery that wakes rounds.
const webhookLine = "webhook wakes a round"

// webhook is when the first delivery for Gitea's job jobID woke a round,
// zero if none did.
func (w *logWatch) webhook(jobID int64) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hooks[jobID]
}

func freeAddr(b *testing.B) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
