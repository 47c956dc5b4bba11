package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

// fakeGitea is one registration's view of Gitea: waiting tasks to hand out
// and the result of every claimed task. Like an HTTP client, every call
// fails once its context has ended.
type fakeGitea struct {
	mu        sync.Mutex
	waiting   []*runnerv1.Task
	claimed   []int64
	results   map[int64]runnerv1.Result
	resultErr map[int64]error // the answer to a task's heartbeat, when set
	declared  [][]string
	fetches   int
	beats     map[int64]int
	finalized map[int64]string
	down      bool
	// finalizeFails is how many Finalize calls fail before one succeeds
	// (a Gitea answering 503); finalizeCalls counts them all.
	finalizeFails, finalizeCalls int
	// onClaim, if set, runs once Gitea has claimed a task and before its
	// answer reaches the caller; with answerLost, a caller whose context has
	// ended by then gets its error instead of the task, as over HTTP.
	onClaim    func()
	answerLost bool
	// calls logs FetchTask ("fetch") and Result ("beat <task>") in order;
	// fetchErr, when set, is every FetchTask's answer.
	calls    []string
	fetchErr error
}

func newFakeGitea(tasks ...*runnerv1.Task) *fakeGitea {
	return &fakeGitea{waiting: tasks, results: map[int64]runnerv1.Result{}, resultErr: map[int64]error{},
		beats: map[int64]int{}, finalized: map[int64]string{}}
}

var errDown = errors.New("connection refused")

func (f *fakeGitea) Declare(ctx context.Context, labels []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return errDown
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f.declared = append(f.declared, labels)
	return nil
}

func (f *fakeGitea) FetchTask(ctx context.Context) (*runnerv1.Task, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, errDown
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.fetches++
	f.calls = append(f.calls, "fetch")
	if f.fetchErr != nil {
		return nil, f.fetchErr
	}
	if len(f.waiting) == 0 {
		return nil, nil
	}
	t := f.waiting[0]
	f.waiting = f.waiting[1:]
	f.claimed = append(f.claimed, t.GetId())
	if f.onClaim != nil {
		f.onClaim()
	}
	if err := ctx.Err(); err != nil && f.answerLost {
		return nil, err // claimed in Gitea, the answer lost
	}
	return t, nil
}

func (f *fakeGitea) Result(ctx context.Context, taskID int64) (runnerv1.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return 0, errDown
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	f.calls = append(f.calls, fmt.Sprintf("beat %d", taskID))
	if err := f.resultErr[taskID]; err != nil {
		return 0, fmt.Errorf("task %d: %w", taskID, err)
	}
	f.beats[taskID]++
	return f.results[taskID], nil
}

func (f *fakeGitea) Finalize(ctx context.Context, taskID int64, result runnerv1.Result, reason string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	f.finalizeCalls++
	if f.finalizeCalls <= f.finalizeFails {
		return errors.New("gitea UpdateLog: unavailable: 503 Service Unavailable")
	}
	f.finalized[taskID] = result.String() + ": " + reason
	if f.results[taskID] == runnerv1.Result_RESULT_UNSPECIFIED {
		f.results[taskID] = result
	}
	return nil
}

func task(t testing.TB, id int64, repository, payload string) *runnerv1.Task {
	t.Helper()
	ctx, err := structpb.NewStruct(map[string]any{"repository": repository, "job": "build", "token": "task-token-secret"})
	if err != nil {
		t.Fatal(err)
	}
	if payload == "" {
		payload = "name: ci\non: push\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo hi\n"
	}
	return &runnerv1.Task{Id: id, Context: ctx, WorkflowPayload: []byte(payload), Secrets: map[string]string{"GITEA_TOKEN": "task-token-secret"}}
}

type fixture struct {
	d        *Dispatcher
	queue    *assignmentqueue.Queue
	payloads *assignmentqueue.Payloads
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	q := jetstreamenv.NewQueue(t)
	return fixture{d: &Dispatcher{TrustDomain: td, Queue: q.Queue, Payloads: q.Payloads, KeepAlive: time.Minute}, queue: q.Queue, payloads: q.Payloads}
}

func pool(g *fakeGitea, capacity int) Pool {
	return Pool{
		Pool:         runnerpool.Pool{Name: "linux", Labels: []string{"ubuntu-latest"}, Backend: taskassignment.BackendProcess, Capacity: capacity},
		Registration: g, Tasks: g,
	}
}

func (f fixture) queued(t *testing.T) []string {
	t.Helper()
	ids, malformed, err := f.queue.Queued(context.Background(), taskassignment.BackendProcess, td)
	if err != nil || malformed != 0 {
		t.Fatalf("Queued() = %v, %d, %v", ids, malformed, err)
	}
	var out []string
	for id := range ids {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func TestDispatchClaimsQueuesAndStores(t *testing.T) {
	f := newFixture(t)
	g := newFakeGitea(task(t, 1, "Alice/Repo", ""), task(t, 2, "alice/other", ""))
	res, err := f.d.Dispatch(context.Background(), pool(g, 5))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Claimed) != 2 || res.Free != 5 || res.InFlight != 0 {
		t.Fatalf("result = %+v", res)
	}
	a := res.Claimed[0]
	if a.ID != "linux-1" || a.Identity.SPIFFEID != "spiffe://ci.example.org/repo/alice/repo/task/1" || a.Identity.Task != "build" || a.Backend != taskassignment.BackendProcess {
		t.Fatalf("assignment = %+v", a)
	}
	if got := f.queued(t); !slices.Equal(got, []string{"linux-1", "linux-2"}) {
		t.Fatalf("queued = %v", got)
	}
	stored, err := f.payloads.Get(context.Background(), "linux-2")
	if err != nil || stored.GetSecrets()["GITEA_TOKEN"] != "task-token-secret" {
		t.Fatalf("payload = %v, %v", stored, err)
	}
	if len(g.declared) != 1 || !slices.Equal(g.declared[0], []string{"ubuntu-latest"}) {
		t.Fatalf("declared = %v", g.declared)
	}
}

// A round declares the pool's labels only when this process has not
// declared them yet (Gitea keeps them): again when they change, and after
// a failed call to Gitea.
func TestDispatchDeclaresOnlyWhatChanged(t *testing.T) {
	f := newFixture(t)
	g := newFakeGitea()
	p := pool(g, 5)
	round := func(name string) {
		t.Helper()
		if _, err := f.d.Dispatch(context.Background(), p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	round("first round")
	round("second round")
	if len(g.declared) != 1 {
		t.Fatalf("two rounds with the same labels declared %d times: %v", len(g.declared), g.declared)
	}
	p.Labels = []string{"ubuntu-latest", "gpu"}
	round("round with new labels")
	if len(g.declared) != 2 || !slices.Equal(g.declared[1], p.Labels) {
		t.Fatalf("new labels not declared: %v", g.declared)
	}
	g.mu.Lock()
	g.down = true
	g.mu.Unlock()
	if _, err := f.d.Dispatch(context.Background(), p); !errors.Is(err, errDown) {
		t.Fatalf("round with Gitea down: %v", err)
	}
	g.mu.Lock()
	g.down = false
	g.mu.Unlock()
	round("round after Gitea failed")
	round("round after that")
	if len(g.declared) != 3 {
		t.Fatalf("after a failed round: declared %d times, want 3: %v", len(g.declared), g.declared)
	}
	if g.fetches != 5 {
		t.Fatalf("%d fetches, want one per round", g.fetches)
	}
}

func TestDispatchRespectsCapacity(t *testing.T) {
	f := newFixture(t)
	g := newFakeGitea(task(t, 1, "a/r", ""), task(t, 2, "a/r", ""), task(t, 3, "a/r", ""))
	p := pool(g, 2)
	res, err := f.d.Dispatch(context.Background(), p)
	if err != nil || len(res.Claimed) != 2 {
		t.Fatalf("first round = %+v, %v", res, err)
	}
	if len(g.waiting) != 1 {
		t.Fatalf("%d tasks left waiting, want 1", len(g.waiting))
	}
	fetches := g.fetches
	res, err = f.d.Dispatch(context.Background(), p)
	if err != nil || len(res.Claimed) != 0 || res.InFlight != 2 || res.Free != 0 {
		t.Fatalf("second round = %+v, %v", res, err)
	}
	if g.fetches != fetches {
		t.Fatal("a full pool asked Gitea for a task")
	}
	// One task finishes: recover deletes its payload, and a slot frees up.
	if err := f.payloads.Delete(context.Background(), "linux-1"); err != nil {
		t.Fatal(err)
	}
	res, err = f.d.Dispatch(context.Background(), p)
	if err != nil || len(res.Claimed) != 1 || res.Claimed[0].Task.ID != 3 {
		t.Fatalf("third round = %+v, %v", res, err)
	}
}

func TestDispatchRejectsTasksItCannotRun(t *testing.T) {
	f := newFixture(t)
	g := newFakeGitea(
		task(t, 1, "no-slash", ""),
		task(t, 2, "a/r", "jobs:\n  a:\n    runs-on: x\n  b:\n    runs-on: x\n"),
		task(t, 3, "a/r", "jobs:\n  build:\n    runs-on: x\n    container:\n      image: golang:1.26\n"),
	)
	res, err := f.d.Dispatch(context.Background(), pool(g, 5))
	if err != nil {
		t.Fatal(err)
	}
	if res.Rejected != 2 || len(res.Claimed) != 1 || res.Claimed[0].Task.Image != "golang:1.26" {
		t.Fatalf("result = %+v", res)
	}
	for id, want := range map[int64]string{1: "not owner/name", 2: "2 jobs"} {
		if !strings.HasPrefix(g.finalized[id], "RESULT_FAILURE") || !strings.Contains(g.finalized[id], want) {
			t.Errorf("task %d finalized as %q, want a failure mentioning %q", id, g.finalized[id], want)
		}
	}
}

func TestDispatchGiteaDownClaimsNothing(t *testing.T) {
	f := newFixture(t)
	g := newFakeGitea(task(t, 1, "a/r", ""))
	g.down = true
	if _, err := f.d.Dispatch(context.Background(), pool(g, 5)); !errors.Is(err, errDown) {
		t.Fatalf("Dispatch() error = %v", err)
	}
	if got := f.queued(t); len(got) != 0 {
		t.Fatalf("queued = %v", got)
	}
	if ids, _ := f.payloads.IDs(context.Background()); len(ids) != 0 {
		t.Fatalf("payloads = %v", ids)
	}
}

func TestKeepAlive(t *testing.T) {
	f := newFixture(t)
	g := newFakeGitea(task(t, 1, "a/r", ""), task(t, 2, "a/r", ""), task(t, 3, "a/r", ""))
	p := pool(g, 3)
	if _, err := f.d.Dispatch(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	// Right after the claim nothing is due.
	res, err := f.d.Dispatch(context.Background(), p)
	if err != nil || res.KeptAlive != 0 {
		t.Fatalf("round after claim = %+v, %v", res, err)
	}
	f.d.KeepAlive = time.Nanosecond // every waiting task is due
	ctx := context.Background()
	if err := f.payloads.MarkStarted(ctx, "linux-2"); err != nil {
		t.Fatal(err)
	}
	g.results[3] = runnerv1.Result_RESULT_CANCELLED
	res, err = f.d.Dispatch(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.KeptAlive != 2 || res.Ended != 1 || res.InFlight != 2 {
		t.Fatalf("result = %+v", res)
	}
	if g.beats[1] != 1 || g.beats[2] != 0 {
		t.Fatalf("heartbeats = %v: want one for the waiting task, none for the started one", g.beats)
	}
	if _, ok := g.finalized[3]; ok {
		t.Fatalf("a task Gitea already ended was reported again (another completed webhook): %q", g.finalized[3])
	}
	ids, _ := f.payloads.IDs(ctx)
	if !slices.Equal(ids, []string{"linux-1", "linux-2"}) {
		t.Fatalf("payloads = %v", ids)
	}
}

// failingPut is a payload store whose Put always fails, as an unreachable
// NATS would (and with the context's error once that has ended).
type failingPut struct{ Payloads }

func (failingPut) Put(ctx context.Context, _ string, _ *runnerv1.Task) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("nats: no responders available for request")
}

// A caller that goes away (SIGTERM, a webhook delivery Gitea gave up on)
// while a task is being claimed: the task Gitea handed out is still stored
// and queued, or failed in Gitea with the reason; never left claimed with
// neither. And nothing more is claimed.
func TestClaimedTaskOutlivesItsCaller(t *testing.T) {
	for _, tc := range []struct {
		name          string
		repository    string
		answerLost    bool
		storeDown     bool
		wantQueued    []string
		wantFinalized string
	}{
		{"stored and queued", "a/r", false, false, []string{"linux-1"}, ""},
		{"cancelled during the call: stored and queued", "a/r", true, false, []string{"linux-1"}, ""},
		{"store down: failed with the reason", "a/r", false, true, nil, "could not store the task"},
		{"cannot run here: failed with the reason", "no-slash", false, false, nil, "cannot run this task"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.storeDown {
				f.d.Payloads = failingPut{f.payloads}
				f.d.StoreWait = 300 * time.Millisecond
			}
			g := newFakeGitea(task(t, 1, tc.repository, ""), task(t, 2, "a/r", ""))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g.onClaim, g.answerLost = cancel, tc.answerLost
			res, err := f.d.Dispatch(ctx, pool(g, 5))
			if err == nil && !tc.storeDown {
				t.Fatalf("Dispatch() = %+v, nil; want the round to say it stopped", res)
			}
			if !slices.Equal(g.claimed, []int64{1}) {
				t.Fatalf("claimed %v, want task 1 only: a cancelled round claims no more", g.claimed)
			}
			if got := f.queued(t); !slices.Equal(got, tc.wantQueued) {
				t.Errorf("queued = %v, want %v", got, tc.wantQueued)
			}
			ids, _ := f.payloads.IDs(context.Background())
			if stored := slices.Contains(ids, "linux-1"); stored != (tc.wantQueued != nil) {
				t.Errorf("payloads = %v", ids)
			}
			got := g.finalized[1]
			if tc.wantFinalized == "" && got != "" || !strings.Contains(got, tc.wantFinalized) {
				t.Errorf("task 1 finalized as %q, want %q", got, tc.wantFinalized)
			}
		})
	}
}

// One waiting task whose heartbeat fails does not hold up its pool: the
// other tasks are kept alive and new ones claimed. A task Gitea no longer has
// (deleted with its repository, another runner's) is dropped, freeing its
// slot; a transient failure keeps it, due again next round.
func TestKeepAliveIsPerTask(t *testing.T) {
	for _, tc := range []struct {
		name      string
		answer    error
		wantEnded int
		wantIDs   []string
	}{
		{"Gitea unavailable", &gitea.Error{Op: "UpdateTask", Code: connect.CodeUnavailable, Message: "connection refused"},
			0, []string{"linux-1", "linux-2", "linux-3", "linux-4"}},
		{"repository deleted", &gitea.Error{Op: "UpdateTask", Code: connect.CodeInternal, Message: "update task: resource does not exist"},
			1, []string{"linux-2", "linux-3", "linux-4"}},
		{"another runner's", &gitea.Error{Op: "UpdateTask", Code: connect.CodeInternal, Message: "update task: invalid runner for task"},
			1, []string{"linux-2", "linux-3", "linux-4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			g := newFakeGitea(task(t, 1, "a/r", ""), task(t, 2, "a/r", ""), task(t, 3, "a/r", ""))
			p := pool(g, 4)
			ctx := context.Background()
			if res, err := f.d.Dispatch(ctx, p); err != nil || len(res.Claimed) != 3 {
				t.Fatalf("first round = %+v, %v", res, err)
			}
			g.waiting = append(g.waiting, task(t, 4, "a/r", ""))
			g.resultErr[1] = tc.answer
			f.d.KeepAlive = time.Nanosecond // every waiting task is due
			res, err := f.d.Dispatch(ctx, p)
			if err != nil {
				t.Fatalf("Dispatch() error = %v", err)
			}
			if len(res.Claimed) != 1 || res.Claimed[0].Task.ID != 4 || res.KeptAlive != 2 || res.Ended != tc.wantEnded || res.Unbeaten != 1-tc.wantEnded {
				t.Fatalf("result = %+v", res)
			}
			if g.beats[2] != 1 || g.beats[3] != 1 {
				t.Fatalf("heartbeats = %v, want one each for tasks 2 and 3", g.beats)
			}
			if ids, _ := f.payloads.IDs(ctx); !slices.Equal(ids, tc.wantIDs) {
				t.Fatalf("payloads = %v, want %v", ids, tc.wantIDs)
			}
		})
	}
}

func TestPoolIDs(t *testing.T) {
	ids := []string{"a-1", "a-1-2", "a-3", "ab-4", "started.a-1", "x"}
	if got := poolIDs(ids, "a"); !slices.Equal(got, []string{"a-1", "a-3"}) {
		t.Fatalf("poolIDs(a) = %v", got)
	}
	if got := poolIDs(ids, "a-1"); !slices.Equal(got, []string{"a-1-2"}) {
		t.Fatalf("poolIDs(a-1) = %v", got)
	}
}

// observed records what an Observer hears.
type observed struct {
	mu     sync.Mutex
	rounds []Result
	errs   []error
	queued []time.Duration
}

func (o *observed) Round(res Result, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rounds, o.errs = append(o.rounds, res), append(o.errs, err)
}

func (o *observed) Queued(pool string, pickup time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.queued = append(o.queued, pickup)
}

// The Observer hears every round once, with its result or error, and every
// task queued with its pickup time.
func TestObserverHearsRoundsAndClaims(t *testing.T) {
	f := newFixture(t)
	obs := &observed{}
	f.d.Observer = obs
	g := newFakeGitea(task(t, 1, "a/r", ""), task(t, 2, "a/r", ""))
	if _, err := f.d.Dispatch(context.Background(), pool(g, 5)); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.down = true
	g.mu.Unlock()
	if _, err := f.d.Dispatch(context.Background(), pool(g, 5)); err == nil {
		t.Fatal("a round with Gitea down succeeded")
	}
	if len(obs.rounds) != 2 || len(obs.rounds[0].Claimed) != 2 || obs.errs[0] != nil || obs.errs[1] == nil || obs.rounds[1].Pool != "linux" {
		t.Fatalf("rounds %+v, errors %v", obs.rounds, obs.errs)
	}
	if len(obs.queued) != 2 || obs.queued[0] <= 0 {
		t.Fatalf("queued pickups %v, want 2 positive", obs.queued)
	}
}

// A job Gitea has ready is claimed before the round heartbeats its waiting
// tasks: it never waits for one Gitea call per waiting task.
func TestDispatchClaimsBeforeHeartbeats(t *testing.T) {
	f := newFixture(t)
	g := newFakeGitea(task(t, 1, "a/r", ""), task(t, 2, "a/r", ""))
	p := pool(g, 3)
	ctx := context.Background()
	if res, err := f.d.Dispatch(ctx, p); err != nil || len(res.Claimed) != 2 {
		t.Fatalf("first round = %+v, %v", res, err)
	}
	g.waiting = append(g.waiting, task(t, 3, "a/r", ""))
	g.calls = nil
	f.d.KeepAlive = time.Nanosecond // both waiting tasks are due
	res, err := f.d.Dispatch(ctx, p)
	if err != nil || len(res.Claimed) != 1 || res.KeptAlive != 2 {
		t.Fatalf("round = %+v, %v", res, err)
	}
	if want := []string{"fetch", "beat 1", "beat 2"}; !slices.Equal(g.calls, want) {
		t.Fatalf("calls to Gitea %q, want %q: the claim first", g.calls, want)
	}
}

// A slot held by a task that its heartbeat finds over is filled within the
// same round, though the claims (which come first) found the pool full.
func TestDispatchFillsTheSlotsItsHeartbeatsFree(t *testing.T) {
	for _, tc := range []struct {
		name   string
		result runnerv1.Result
		answer error
	}{
		{"cancelled while waiting", runnerv1.Result_RESULT_CANCELLED, nil},
		{"gone from Gitea", 0, &gitea.Error{Op: "UpdateTask", Code: connect.CodeInternal, Message: "update task: resource does not exist"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			g := newFakeGitea(task(t, 1, "a/r", ""))
			p := pool(g, 1)
			ctx := context.Background()
			if res, err := f.d.Dispatch(ctx, p); err != nil || len(res.Claimed) != 1 {
				t.Fatalf("first round = %+v, %v", res, err)
			}
			g.waiting = append(g.waiting, task(t, 2, "a/r", ""))
			g.results[1], g.resultErr[1] = tc.result, tc.answer
			g.calls = nil
			f.d.KeepAlive = time.Nanosecond
			res, err := f.d.Dispatch(ctx, p)
			if err != nil || res.Ended != 1 || len(res.Claimed) != 1 || res.Claimed[0].Task.ID != 2 || res.InFlight != 0 || res.Free != 1 {
				t.Fatalf("round = %+v, %v", res, err)
			}
			if want := []string{"beat 1", "fetch"}; !slices.Equal(g.calls, want) {
				t.Fatalf("calls to Gitea %q, want %q: no claim while full, one after the slot freed", g.calls, want)
			}
			if ids, _ := f.payloads.IDs(ctx); !slices.Equal(ids, []string{"linux-2"}) {
				t.Fatalf("payloads = %v, want only the new task's", ids)
			}
		})
	}
}

// Claims that fail (FetchTask answers an error) still leave the round to
// keep the waiting tasks alive, and the round reports the claims' error.
func TestDispatchKeepsAliveWhenClaimsFail(t *testing.T) {
	f := newFixture(t)
	g := newFakeGitea(task(t, 1, "a/r", ""))
	p := pool(g, 2)
	ctx := context.Background()
	if res, err := f.d.Dispatch(ctx, p); err != nil || len(res.Claimed) != 1 {
		t.Fatalf("first round = %+v, %v", res, err)
	}
	g.fetchErr = &gitea.Error{Op: "FetchTask", Code: connect.CodeUnavailable, Message: "busy"}
	f.d.KeepAlive = time.Nanosecond
	res, err := f.d.Dispatch(ctx, p)
	if !errors.Is(err, g.fetchErr) || res.KeptAlive != 1 || g.beats[1] != 1 {
		t.Fatalf("round = %+v, %v; heartbeats %v: want the fetch error and task 1 kept alive", res, err, g.beats)
	}
}

// flakyPut is a payload store whose first fails Puts fail as a JetStream
// stream does while its leader is being elected; puts counts every try.
type flakyPut struct {
	Payloads
	mu          sync.Mutex
	fails, puts int
}

func (p *flakyPut) Put(ctx context.Context, id string, task *runnerv1.Task) error {
	p.mu.Lock()
	p.puts++
	n := p.puts
	p.mu.Unlock()
	if n <= p.fails {
		return errors.New("nats: no responders available for request")
	}
	return p.Payloads.Put(ctx, id, task)
}

// A claimed task is not lost to a moment NATS or Gitea cannot answer (the
// chaos run on a 3-node cluster lost task 481 to a payload write refused
// during a leader election, then a Finalize Gitea answered 503): the payload
// write is retried until StoreWait, and the compensating Finalize until
// ClaimTimeout. Each case first checks that its faults happened.
func TestClaimedTaskSurvivesBriefRefusals(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		putFails, finalizeFails int
		wantQueued              bool
		wantFinalizeCalls       int
	}{
		{"the write refused three times: stored and queued", 3, 0, true, 0},
		{"the store down, Gitea refusing twice: failed with the reason", 1 << 30, 2, false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			store := &flakyPut{Payloads: f.payloads, fails: tc.putFails}
			f.d.Payloads, f.d.StoreWait = store, 2*time.Second
			g := newFakeGitea(task(t, 1, "a/r", ""))
			g.finalizeFails = tc.finalizeFails
			_, err := f.d.Dispatch(context.Background(), pool(g, 5))
			// The faults happened: a write refused, and Finalize refused when asked to.
			if store.puts < 1 || (tc.finalizeFails > 0 && g.finalizeCalls < 1) {
				t.Fatalf("faults not reached: %d puts (%d to fail), %d Finalize calls (%d to fail)", store.puts, tc.putFails, g.finalizeCalls, tc.finalizeFails)
			}
			if got := f.queued(t); slices.Equal(got, []string{"linux-1"}) != tc.wantQueued {
				t.Fatalf("queued = %v (round error %v), want queued %v", got, err, tc.wantQueued)
			}
			if g.finalizeCalls != tc.wantFinalizeCalls {
				t.Fatalf("%d Finalize calls, want %d", g.finalizeCalls, tc.wantFinalizeCalls)
			}
			if !tc.wantQueued && !strings.Contains(g.finalized[1], "could not store the task") {
				t.Fatalf("task 1 finalized %q, want the reason", g.finalized[1])
			}
		})
	}
}

// A paused pool claims nothing and declares nothing (Gitea keeps its jobs queued), keeps its
// waiting tasks alive, and claims again once resumed.
func TestPausedPoolClaimsNothing(t *testing.T) {
	f := newFixture(t)
	g := newFakeGitea(task(t, 1, "a/r", ""), task(t, 2, "a/r", ""), task(t, 3, "a/r", ""))
	p := pool(g, 2)
	ctx := context.Background()
	if res, err := f.d.Dispatch(ctx, p); err != nil || len(res.Claimed) != 2 {
		t.Fatalf("first round = %+v, %v", res, err)
	}
	p.Paused = true
	f.d.KeepAlive = time.Nanosecond               // every waiting task is due
	g.results[1] = runnerv1.Result_RESULT_SUCCESS // its job ended: a slot is free
	declared, fetches := len(g.declared), g.fetches
	res, err := f.d.Dispatch(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Paused || len(res.Claimed) != 0 || res.KeptAlive != 2 || res.Ended != 1 || res.Free != 1 {
		t.Fatalf("paused round = %+v: want nothing claimed into the free slot, both waiting tasks kept alive", res)
	}
	if len(g.declared) != declared || g.fetches != fetches || len(g.waiting) != 1 {
		t.Fatalf("paused round asked Gitea: %d declares, %d fetches (before %d, %d); %d queued left", len(g.declared), g.fetches, declared, fetches, len(g.waiting))
	}
	p.Paused = false
	if res, err := f.d.Dispatch(ctx, p); err != nil || len(res.Claimed) != 1 || res.Paused {
		t.Fatalf("round once resumed = %+v, %v", res, err)
	}
}
