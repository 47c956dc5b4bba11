package recoverer

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor/executortest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

// giteaView is Gitea's side: which tasks are over, and what was reported.
type giteaView struct {
	mu       sync.Mutex
	over     map[int64]bool
	reported map[int64]executor.Phase
	reasons  map[int64]string
}

func (g *giteaView) Terminal(_ context.Context, id int64) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.over[id], nil
}

func (g *giteaView) Report(_ context.Context, id int64, e executor.Executor) error {
	p := e.Phase
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reported[id] = p
	if g.reasons != nil {
		g.reasons[id] = e.Reason
	}
	g.over[id] = true
	return nil
}

type fixture struct {
	r        *Recoverer
	backend  *executortest.Memory
	gitea    *giteaView
	queue    *assignmentqueue.Queue
	payloads *assignmentqueue.Payloads
	endings  *assignmentqueue.Endings
	boot     *bootstrap.Bootstrap
	js       jetstream.JetStream
}

func setup(t *testing.T) fixture {
	t.Helper()
	env := jetstreamenv.NewQueue(t)
	env.OpenConsumer(t, taskassignment.BackendProcess, 10)
	q, payloads := env.Queue, env.Payloads
	keys, _ := taskassignment.NewKeys("ci.example.org")
	boot, _ := bootstrap.New(bytes.Repeat([]byte{3}, 32), "https://gw.example.org", spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	mem := executortest.NewMemory("local")
	mem.Keys, mem.TrustDomain = keys, td
	g := &giteaView{over: map[int64]bool{}, reported: map[int64]executor.Phase{}}
	r := &Recoverer{
		TrustDomain: td, Keys: keys, Bootstrap: boot,
		Backends: map[taskassignment.BackendKind]executor.Backend{taskassignment.BackendProcess: mem},
		Pools:    map[string]Pool{"linux": {Pool: runnerpool.Pool{Name: "linux", Backend: taskassignment.BackendProcess, Capacity: 5}, Tasks: g}},
		Queue:    q, Sender: q, Payloads: payloads, Endings: env.Endings,
	}
	return fixture{r: r, backend: mem, gitea: g, queue: q, payloads: payloads, endings: env.Endings, boot: boot, js: env.JetStream}
}

func task(t *testing.T, id int64) *runnerv1.Task {
	t.Helper()
	c, _ := structpb.NewStruct(map[string]any{"repository": "alice/repo", "job": "build"})
	return &runnerv1.Task{Id: id, Context: c, WorkflowPayload: []byte("jobs:\n  build:\n    runs-on: x\n")}
}

// claimed stores a payload for task id as dispatch would, and returns its
// assignment; with executor, also creates the executor as handle would.
func (f fixture) claimed(t *testing.T, id int64, withExecutor bool) taskassignment.Assignment {
	t.Helper()
	identity, _ := taskidentity.New(td, "alice/repo", "build", id)
	a, err := taskassignment.New(taskassignment.BackendProcess, taskassignment.Task{ID: id, Pool: "linux"}, identity)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.payloads.Put(context.Background(), a.ID, task(t, id)); err != nil {
		t.Fatal(err)
	}
	if withExecutor {
		w := executor.Worker{Backend: f.backend, Bootstrap: f.boot, Keys: f.r.Keys}
		if _, err := w.Accept(context.Background(), a); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

func (f fixture) setPhase(a taskassignment.Assignment, p executor.Phase) {
	e, _ := f.backend.Find(context.Background(), a.ID)
	e.Phase = p
	f.backend.Set(a.ID, *e)
}

func (f fixture) hasPayload(t *testing.T, id string) bool {
	t.Helper()
	ids, err := f.payloads.IDs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func TestRun(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	succeeded := f.claimed(t, 1, true)
	f.setPhase(succeeded, executor.PhaseSucceeded)
	running := f.claimed(t, 2, true)
	f.setPhase(running, executor.PhaseRunning)
	cancelled := f.claimed(t, 3, true)
	f.gitea.over[3] = true
	orphan := f.claimed(t, 4, false)
	endedOrphan := f.claimed(t, 5, false)
	f.gitea.over[5] = true
	queued := f.claimed(t, 6, false)
	if _, err := f.queue.Publish(ctx, queued); err != nil {
		t.Fatal(err)
	}

	sum, err := f.r.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := Summary{Executors: 3, Done: 2, Pending: 1, Republished: 1, PayloadsDeleted: 1}
	if sum != want {
		t.Fatalf("summary = %+v, want %+v", sum, want)
	}
	if f.gitea.reported[1] != executor.PhaseSucceeded || len(f.gitea.reported) != 1 {
		t.Fatalf("reported = %v", f.gitea.reported)
	}
	for _, tc := range []struct {
		a                taskassignment.Assignment
		executor, stored bool
	}{
		{succeeded, false, false}, {running, true, true}, {cancelled, false, false},
		{orphan, false, true}, {endedOrphan, false, false}, {queued, false, true},
	} {
		e, _ := f.backend.Find(ctx, tc.a.ID)
		if (e != nil) != tc.executor || f.hasPayload(t, tc.a.ID) != tc.stored {
			t.Errorf("%s: executor %v payload %v, want %v %v", tc.a.ID, e != nil, f.hasPayload(t, tc.a.ID), tc.executor, tc.stored)
		}
	}
	q, _, err := f.queue.Queued(ctx, taskassignment.BackendProcess, td)
	if err != nil || !q[orphan.ID] || !q[queued.ID] || len(q) != 2 {
		t.Fatalf("queued after Run = %v, %v", q, err)
	}

	// A second run changes nothing more.
	again, err := f.r.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if again != (Summary{Executors: 1, Pending: 1}) {
		t.Fatalf("second run = %+v", again)
	}
}

func TestUnknownPoolIsLeftAlone(t *testing.T) {
	f := setup(t)
	a := f.claimed(t, 1, true)
	f.setPhase(a, executor.PhaseFailed)
	delete(f.r.Pools, "linux")
	sum, err := f.r.Run(context.Background())
	if err != nil || sum.UnknownPool != 1 || sum.Done != 0 {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
	if e, _ := f.backend.Find(context.Background(), a.ID); e == nil {
		t.Fatal("the executor of an unknown pool was touched")
	}
}

func TestFinish(t *testing.T) {
	type state struct{ executor, payload bool }
	for _, tc := range []struct {
		name     string
		executor bool
		phase    executor.Phase
		over     bool
		change   func(f fixture)
		want     Summary
		wantErr  bool
		reported executor.Phase
		after    state
	}{
		{name: "succeeded: reported, then cleaned up", executor: true, phase: executor.PhaseSucceeded,
			want: Summary{Executors: 1, Done: 1}, reported: executor.PhaseSucceeded},
		{name: "failed: reported, then cleaned up", executor: true, phase: executor.PhaseFailed,
			want: Summary{Executors: 1, Done: 1}, reported: executor.PhaseFailed},
		{name: "Gitea says over: cleaned up, not reported", executor: true, phase: executor.PhaseRunning, over: true,
			want: Summary{Executors: 1, Done: 1}},
		{name: "still running: left as it is", executor: true, phase: executor.PhaseRunning,
			want: Summary{Executors: 1, Pending: 1}, after: state{executor: true, payload: true}},
		{name: "no executor: nothing to do, the payload is Run's", executor: false,
			want: Summary{}, after: state{payload: true}},
		{name: "unknown pool: left alone", executor: true, phase: executor.PhaseSucceeded,
			change: func(f fixture) { delete(f.r.Pools, "linux") },
			want:   Summary{Executors: 1, UnknownPool: 1}, after: state{executor: true, payload: true}},
		{name: "metadata does not rebuild", executor: true, phase: executor.PhaseSucceeded,
			change:  func(f fixture) { f.backend.TrustDomain = spiffeid.RequireTrustDomainFromString("elsewhere.org") },
			wantErr: true, after: state{executor: true, payload: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			ctx := context.Background()
			a := f.claimed(t, 1, tc.executor)
			if tc.executor {
				f.setPhase(a, tc.phase)
			}
			f.gitea.over[1] = tc.over
			if tc.change != nil {
				tc.change(f)
			}
			sum, err := f.r.Finish(ctx, f.backend, a.ID)
			if (err != nil) != tc.wantErr || sum != tc.want {
				t.Fatalf("Finish() = %+v, %v; want %+v, error %v", sum, err, tc.want, tc.wantErr)
			}
			if got := f.gitea.reported[1]; got != tc.reported {
				t.Errorf("reported %q, want %q", got, tc.reported)
			}
			e, _ := f.backend.Find(ctx, a.ID)
			if got := (state{executor: e != nil, payload: f.hasPayload(t, a.ID)}); got != tc.after {
				t.Errorf("after Finish: %+v, want %+v", got, tc.after)
			}
		})
	}
}

// racingBackend is the fixture's backend as Run sees it: the first Find of
// the assignment (Run's Handle, after it asked Gitea) runs first, to its end,
// a Finish of that assignment, as a concurrent caller would that learnt of
// the executor's end at that moment.
type racingBackend struct {
	*executortest.Memory
	once   sync.Once
	finish func()
}

func (b *racingBackend) Find(ctx context.Context, id string) (*executor.Executor, error) {
	b.once.Do(b.finish)
	return b.Memory.Find(ctx, id)
}

// A Run that listed an executor and asked Gitea before the job ended, racing
// a Finish that reports and deletes that executor, never creates it again:
// the runner of a finished job could otherwise fetch the payload and run the
// job a second time.
func TestRunRacingFinishNeverCreates(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	a := f.claimed(t, 1, true)
	f.setPhase(a, executor.PhaseSucceeded)
	var finished Summary
	var finishErr error
	racing := &racingBackend{Memory: f.backend, finish: func() {
		finished, finishErr = f.r.Finish(ctx, f.backend, a.ID)
	}}
	// Gitea learns of the report only after Run's Handle asked it: the
	// report reaches the fake, which answers "over" from then on, but Run's
	// Handle already holds "not over".
	f.r.Backends[taskassignment.BackendProcess] = racing

	sum, err := f.r.Run(ctx)
	if err != nil || finishErr != nil {
		t.Fatalf("Run() = %+v, %v; Finish error %v", sum, err, finishErr)
	}
	if finished != (Summary{Executors: 1, Done: 1}) {
		t.Fatalf("Finish() = %+v, want it to report and clean up", finished)
	}
	if n := f.backend.Creates(); n != 1 {
		t.Fatalf("%d executors created, want 1 (handle's own): the finished job's executor was created again", n)
	}
	if e, _ := f.backend.Find(ctx, a.ID); e != nil {
		t.Fatalf("executor %s exists after the race", e.Name)
	}
	if f.hasPayload(t, a.ID) {
		t.Fatal("the payload of the finished task is still stored")
	}
	if f.gitea.reported[1] != executor.PhaseSucceeded {
		t.Fatalf("reported = %v", f.gitea.reported)
	}
}

// Run and Finish side by side on many assignments, with no ordering at all,
// create nothing and leave nothing.
func TestRunAndFinishConcurrently(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	var as []taskassignment.Assignment
	for id := int64(1); id <= 20; id++ {
		a := f.claimed(t, id, true)
		f.setPhase(a, executor.PhaseSucceeded)
		as = append(as, a)
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if _, err := f.r.Run(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	for _, a := range as {
		wg.Go(func() {
			if _, err := f.r.Finish(ctx, f.backend, a.ID); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := f.backend.Creates(); n != len(as) {
		t.Fatalf("%d executors created, want %d (handle's own)", n, len(as))
	}
	for _, a := range as {
		if e, _ := f.backend.Find(ctx, a.ID); e != nil || f.hasPayload(t, a.ID) {
			t.Errorf("%s: executor %v, payload %v left", a.ID, e != nil, f.hasPayload(t, a.ID))
		}
	}
}

// A pass that finishes an executor marks its task ended before it deletes
// it: a message of the assignment delivered again afterwards (a handle killed
// before its ack) is accepted by handle without a second executor.
func TestRunMarksFinishedTasksEnded(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	a := f.claimed(t, 1, true)
	f.backend.Set(a.ID, executor.Executor{Name: "exec-" + a.ID, IdentityTarget: "local", Phase: executor.PhaseSucceeded})
	if sum, err := f.r.Run(ctx); err != nil || sum.Done != 1 {
		t.Fatalf("Run = %+v, %v", sum, err)
	}
	w := executor.Worker{Backend: f.backend, Bootstrap: f.boot, Keys: f.r.Keys, Endings: f.endings}
	if ok, err := w.Accept(ctx, a); !ok || err != nil {
		t.Fatalf("redelivered Accept = %v, %v", ok, err)
	}
	if n := f.backend.Creates(); n != 1 {
		t.Fatalf("executor created %d times: the redelivery after the task ended created it again", n)
	}
}

// An executor that took its task and then vanished without a report (an
// OpenSandbox sandbox removed at its expiry, a Pod deleted by hand) leaves
// a payload with neither message nor executor. Re-publishing it, as for a
// payload no executor ever took, would run the job a second time over what
// the first run did; the task is failed with a reason instead, and a message
// of it delivered again creates nothing.
func TestRunFailsATaskWhoseExecutorVanished(t *testing.T) {
	f := setup(t)
	f.gitea.reasons = map[int64]string{}
	ctx := context.Background()
	taken := f.claimed(t, 1, true)
	never := f.claimed(t, 2, false) // no executor ever: re-published as before
	// Its runner fetched the task.
	if err := f.payloads.MarkStarted(ctx, taken.ID); err != nil {
		t.Fatal(err)
	}
	e, err := f.backend.Find(ctx, taken.ID)
	if err != nil || e == nil {
		t.Fatalf("executor of %s: %v, %v", taken.ID, e, err)
	}
	if err := f.backend.Delete(ctx, e); err != nil { // it vanishes, reporting nothing
		t.Fatal(err)
	}
	// The fault happened: no executor, the payload and its started mark stay,
	// no message is queued, Gitea still runs the task.
	if e, _ := f.backend.Find(ctx, taken.ID); e != nil || !f.hasPayload(t, taken.ID) || f.gitea.over[1] {
		t.Fatalf("before the pass: executor %v, payload %v, over %v", e, f.hasPayload(t, taken.ID), f.gitea.over[1])
	}
	if started, err := f.payloads.Started(ctx, taken.ID); err != nil || !started {
		t.Fatalf("started mark = %v, %v", started, err)
	}

	sum, err := f.r.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Summary{Republished: 1, Vanished: 1}); sum != want {
		t.Fatalf("summary = %+v, want %+v", sum, want)
	}
	q, _, err := f.queue.Queued(ctx, taskassignment.BackendProcess, td)
	if err != nil || q[taken.ID] || !q[never.ID] {
		t.Fatalf("queued after Run = %v, %v: the vanished executor's task must not be sent again", q, err)
	}
	if f.gitea.reported[1] != executor.PhaseFailed || !strings.Contains(f.gitea.reasons[1], "vanished") {
		t.Fatalf("task 1 reported %q with reason %q, want failed, vanished", f.gitea.reported[1], f.gitea.reasons[1])
	}
	if f.hasPayload(t, taken.ID) {
		t.Fatal("the vanished executor's payload is still stored")
	}
	w := executor.Worker{Backend: f.backend, Bootstrap: f.boot, Keys: f.r.Keys, Endings: f.endings}
	if ok, err := w.Accept(ctx, taken); !ok || err != nil {
		t.Fatalf("redelivered Accept = %v, %v", ok, err)
	}
	if n := f.backend.Creates(); n != 1 {
		t.Fatalf("executor created %d times: the vanished executor's task was started again", n)
	}
}
