package dispatcher

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

// fakeGitea is one registration's view of Gitea: waiting tasks to hand out
// and the result of every claimed task.
type fakeGitea struct {
	mu        sync.Mutex
	waiting   []*runnerv1.Task
	results   map[int64]runnerv1.Result
	declared  [][]string
	fetches   int
	beats     map[int64]int
	finalized map[int64]string
	down      bool
}

func newFakeGitea(tasks ...*runnerv1.Task) *fakeGitea {
	return &fakeGitea{waiting: tasks, results: map[int64]runnerv1.Result{}, beats: map[int64]int{}, finalized: map[int64]string{}}
}

var errDown = errors.New("connection refused")

func (f *fakeGitea) Declare(_ context.Context, labels []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return errDown
	}
	f.declared = append(f.declared, labels)
	return nil
}

func (f *fakeGitea) FetchTask(context.Context) (*runnerv1.Task, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, errDown
	}
	f.fetches++
	if len(f.waiting) == 0 {
		return nil, nil
	}
	t := f.waiting[0]
	f.waiting = f.waiting[1:]
	return t, nil
}

func (f *fakeGitea) Result(_ context.Context, taskID int64) (runnerv1.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return 0, errDown
	}
	f.beats[taskID]++
	return f.results[taskID], nil
}

func (f *fakeGitea) Finalize(_ context.Context, taskID int64, result runnerv1.Result, reason string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
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
		Pool:   runnerpool.Pool{Name: "linux", Labels: []string{"ubuntu-latest"}, Backend: taskassignment.BackendProcess, Capacity: capacity},
		Runner: g, Tasks: g,
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

func TestPoolIDs(t *testing.T) {
	ids := []string{"a-1", "a-1-2", "a-3", "ab-4", "started.a-1", "x"}
	if got := poolIDs(ids, "a"); !slices.Equal(got, []string{"a-1", "a-3"}) {
		t.Fatalf("poolIDs(a) = %v", got)
	}
	if got := poolIDs(ids, "a-1"); !slices.Equal(got, []string{"a-1-2"}) {
		t.Fatalf("poolIDs(a-1) = %v", got)
	}
}
