package gateway

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// noticesFixture is a gateway publishing finish notices into a real stream.
func noticesFixture(t *testing.T) (fixture, jetstream.Consumer) {
	t.Helper()
	ctx := context.Background()
	_, url := jetstreamenv.Start(t)
	_, js := jetstreamenv.Connect(t, url)
	finished := assignmentqueue.NewFinished(js, "")
	if err := finished.Ensure(ctx, taskassignment.BackendPod); err != nil {
		t.Fatal(err)
	}
	c, err := finished.Consumer(ctx, taskassignment.BackendPod)
	if err != nil {
		t.Fatal(err)
	}
	f := startWith(t, func(g *Gateway) {
		g.Finished = finished
		g.Backends = map[string]taskassignment.BackendKind{"linux": taskassignment.BackendPod}
	})
	return f, c
}

// notices returns the assignment IDs of the notices stored for the pod
// backend, acknowledging them.
func notices(t *testing.T, c jetstream.Consumer) []string {
	t.Helper()
	batch, err := c.Fetch(10, jetstream.FetchMaxWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for m := range batch.Messages() {
		ids = append(ids, string(m.Data()))
		_ = m.Ack()
	}
	return ids
}

func updateTask(ctx context.Context, f fixture, t *testing.T, result runnerv1.Result) error {
	t.Helper()
	_, err := f.own(t, 7).UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 7, Result: result}}))
	return err
}

func TestFinalUpdateTaskPublishesOneNotice(t *testing.T) {
	f, c := noticesFixture(t)
	ctx := context.Background()
	// The runner retries its final report: one notice still.
	for range 2 {
		if err := updateTask(ctx, f, t, runnerv1.Result_RESULT_SUCCESS); err != nil {
			t.Fatal(err)
		}
	}
	if got := notices(t, c); len(got) != 1 || got[0] != "linux-7" {
		t.Fatalf("notices %q, want exactly [linux-7]", got)
	}
}

func TestNonFinalUpdateTaskPublishesNoNotice(t *testing.T) {
	f, c := noticesFixture(t)
	ctx := context.Background()
	if err := updateTask(ctx, f, t, runnerv1.Result_RESULT_UNSPECIFIED); err != nil {
		t.Fatal(err)
	}
	if _, err := f.own(t, 7).UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 7, Rows: []*runnerv1.LogRow{{Content: "x"}}})); err != nil {
		t.Fatal(err)
	}
	if got := notices(t, c); len(got) != 0 {
		t.Fatalf("notices %q for a task still running", got)
	}
}

func TestRefusedFinalUpdateTaskPublishesNoNotice(t *testing.T) {
	f, c := noticesFixture(t)
	f.gitea.fail = &gitea.Error{Code: connect.CodeNotFound, Message: "task not found"}
	if err := updateTask(context.Background(), f, t, runnerv1.Result_RESULT_FAILURE); code(err) != connect.CodeNotFound {
		t.Fatalf("UpdateTask = %v, want Gitea's refusal", err)
	}
	if got := notices(t, c); len(got) != 0 {
		t.Fatalf("notices %q for a report Gitea refused", got)
	}
}

// failingNotifier fails every publish, and counts them.
type failingNotifier struct {
	mu    sync.Mutex
	calls int
}

func (n *failingNotifier) Publish(context.Context, taskassignment.BackendKind, string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls++
	return errors.New("nats: no responders available for request")
}

func TestFailedNoticeDoesNotFailTheUpdateTask(t *testing.T) {
	n := &failingNotifier{}
	f := startWith(t, func(g *Gateway) {
		g.Finished = n
		g.Backends = map[string]taskassignment.BackendKind{"linux": taskassignment.BackendPod}
	})
	if err := updateTask(context.Background(), f, t, runnerv1.Result_RESULT_SUCCESS); err != nil {
		t.Fatalf("UpdateTask failed with its notice: %v", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.calls != 1 {
		t.Fatalf("%d publishes, want 1", n.calls)
	}
	if len(f.gitea.tasks) != 1 {
		t.Fatalf("Gitea got %v", f.gitea.tasks)
	}
}

// A pool whose backend the gateway does not know gets no notice (its subject
// would be a guess), and its report still succeeds.
func TestNoticeOfAPoolWithoutBackendIsNotSent(t *testing.T) {
	n := &failingNotifier{}
	f := startWith(t, func(g *Gateway) { g.Finished = n })
	if err := updateTask(context.Background(), f, t, runnerv1.Result_RESULT_SUCCESS); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.calls != 0 {
		t.Fatalf("%d publishes for a pool without a backend", n.calls)
	}
}
