package recoverer

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// notices returns the finish mode of the fixture's backend on a real stream,
// with short timings, and the stream to publish into.
func (f fixture) notices(t *testing.T) (Notices, *assignmentqueue.Finished, jetstream.Consumer) {
	t.Helper()
	ctx := context.Background()
	finished := assignmentqueue.NewFinished(f.js, "")
	if err := finished.Ensure(ctx, taskassignment.BackendProcess); err != nil {
		t.Fatal(err)
	}
	c, err := finished.Consumer(ctx, taskassignment.BackendProcess)
	if err != nil {
		t.Fatal(err)
	}
	return Notices{Recoverer: f.r, Backend: taskassignment.BackendProcess, Executors: f.backend, Consumer: c,
		Batch: 4, Wait: 500 * time.Millisecond, Retry: 50 * time.Millisecond}, finished, c
}

// settled reports the consumer's outstanding notices: not yet delivered, and
// delivered but not settled.
func settled(t *testing.T, c jetstream.Consumer) (pending uint64, ackPending int) {
	t.Helper()
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumPending, info.NumAckPending
}

func publishNotice(t *testing.T, finished *assignmentqueue.Finished, id string) {
	t.Helper()
	if err := finished.Publish(context.Background(), taskassignment.BackendProcess, id); err != nil {
		t.Fatal(err)
	}
}

func TestNoticeOfAFinishedExecutor(t *testing.T) {
	f := setup(t)
	n, finished, c := f.notices(t)
	a := f.claimed(t, 1, true)
	f.setPhase(a, executor.PhaseSucceeded)
	publishNotice(t, finished, a.ID)

	sum, err := n.Run(context.Background())
	if err != nil || sum != (NoticeSummary{Fetched: 1, Finished: 1}) {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
	if f.gitea.reported[1] != executor.PhaseSucceeded {
		t.Fatalf("reported = %v", f.gitea.reported)
	}
	if e, _ := f.backend.Find(context.Background(), a.ID); e != nil || f.hasPayload(t, a.ID) {
		t.Fatalf("executor %v, payload %v left", e != nil, f.hasPayload(t, a.ID))
	}
	if p, ap := settled(t, c); p != 0 || ap != 0 {
		t.Fatalf("%d pending, %d ack-pending: the notice was not acknowledged", p, ap)
	}
	// A notice of an executor already gone (the pass got there first) is
	// acknowledged too.
	publishNotice(t, finished, "linux-2")
	if sum, err := n.Run(context.Background()); err != nil || sum != (NoticeSummary{Fetched: 1, Absent: 1}) {
		t.Fatalf("Run() of an absent executor = %+v, %v", sum, err)
	}
	if p, ap := settled(t, c); p != 0 || ap != 0 {
		t.Fatalf("%d pending, %d ack-pending after an absent executor", p, ap)
	}
}

func TestNoticeOfAnExecutorNotEndedYetIsRetried(t *testing.T) {
	f := setup(t)
	n, finished, c := f.notices(t)
	a := f.claimed(t, 1, true)
	f.setPhase(a, executor.PhaseRunning) // the runner reported, and is still exiting
	publishNotice(t, finished, a.ID)

	sum, err := n.Run(context.Background())
	if err != nil || sum != (NoticeSummary{Fetched: 1, Retried: 1}) {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
	if e, _ := f.backend.Find(context.Background(), a.ID); e == nil || !f.hasPayload(t, a.ID) || len(f.gitea.reported) != 0 {
		t.Fatal("a running executor was touched")
	}
	if p, ap := settled(t, c); p+uint64(ap) != 1 {
		t.Fatalf("%d pending, %d ack-pending: the notice is not coming back", p, ap)
	}
	f.setPhase(a, executor.PhaseFailed) // it has exited now
	time.Sleep(2 * n.Retry)
	sum, err = n.Run(context.Background())
	if err != nil || sum != (NoticeSummary{Fetched: 1, Finished: 1}) {
		t.Fatalf("second Run() = %+v, %v", sum, err)
	}
	if f.gitea.reported[1] != executor.PhaseFailed || f.hasPayload(t, a.ID) {
		t.Fatalf("reported %v, payload %v", f.gitea.reported, f.hasPayload(t, a.ID))
	}
}

// A notice whose executor never ends is terminated on its last delivery,
// never left in the stream undeliverable.
func TestNoticeIsDroppedOnItsLastDelivery(t *testing.T) {
	f := setup(t)
	n, finished, _ := f.notices(t)
	a := f.claimed(t, 1, true)
	f.setPhase(a, executor.PhaseRunning)
	publishNotice(t, finished, a.ID)
	var total NoticeSummary
	for range taskassignment.FinishedMaxDeliver {
		sum, err := n.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		total.Fetched += sum.Fetched
		total.Retried += sum.Retried
		total.Dropped += sum.Dropped
		time.Sleep(2 * n.Retry)
	}
	want := NoticeSummary{Fetched: taskassignment.FinishedMaxDeliver, Retried: taskassignment.FinishedMaxDeliver - 1, Dropped: 1}
	if total != want {
		t.Fatalf("over %d runs: %+v, want %+v", taskassignment.FinishedMaxDeliver, total, want)
	}
	s, err := f.js.Stream(context.Background(), finished.Stream())
	if err != nil {
		t.Fatal(err)
	}
	if msgs := s.CachedInfo().State.Msgs; msgs != 0 {
		t.Fatalf("%d notices left in the stream", msgs)
	}
	if e, _ := f.backend.Find(context.Background(), a.ID); e == nil {
		t.Fatal("the running executor was deleted")
	}
}

func TestMalformedOrForeignNoticeIsTerminated(t *testing.T) {
	f := setup(t)
	n, _, c := f.notices(t)
	ctx := context.Background()
	for _, body := range []string{"not an assignment", "windows-3"} { // windows: no pool of this backend
		if _, err := f.js.Publish(ctx, assignmentqueue.FinishedSubject(taskassignment.BackendProcess), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := n.Run(ctx)
	if err != nil || sum != (NoticeSummary{Fetched: 2, Dropped: 2}) {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
	if p, ap := settled(t, c); p != 0 || ap != 0 {
		t.Fatalf("%d pending, %d ack-pending", p, ap)
	}
}

// cancellingGitea ends the run's context (SIGTERM) on its first question,
// and answers as an HTTP client would once it has ended.
type cancellingGitea struct {
	*giteaView
	cancel context.CancelFunc
}

func (g cancellingGitea) Terminal(ctx context.Context, id int64) (bool, error) {
	g.cancel()
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return g.giteaView.Terminal(ctx, id)
}

// SIGTERM during a batch hands back every notice not finished, at once: they
// are deliverable again without waiting for the ack wait or a retry delay.
func TestSIGTERMHandsNoticesBack(t *testing.T) {
	f := setup(t)
	n, finished, c := f.notices(t)
	n.Retry = time.Hour // a notice naked with its delay would not come back
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := f.r.Pools["linux"]
	pool.Tasks = cancellingGitea{giteaView: f.gitea, cancel: cancel}
	f.r.Pools["linux"] = pool
	for id := int64(1); id <= 3; id++ {
		a := f.claimed(t, id, true)
		f.setPhase(a, executor.PhaseSucceeded)
		publishNotice(t, finished, a.ID)
	}
	sum, err := n.Run(ctx)
	if err != nil || sum.Fetched == 0 || sum.Finished != 0 || sum.Retried != sum.Fetched {
		t.Fatalf("Run() = %+v, %v; want every fetched notice handed back", sum, err)
	}
	batch, err := c.Fetch(3, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	again := 0
	for range batch.Messages() {
		again++
	}
	if again != 3 {
		t.Fatalf("%d of 3 notices deliverable again at once", again)
	}
	for id := int64(1); id <= 3; id++ {
		if e, _ := f.backend.Find(context.Background(), "linux-"+string(rune('0'+id))); e == nil {
			t.Fatalf("executor of task %d touched", id)
		}
	}
}
