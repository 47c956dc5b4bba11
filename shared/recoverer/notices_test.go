package recoverer

import (
	"context"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// notices returns the fixture's NoticeHandler for its process backend.
func (f fixture) notices() NoticeHandler {
	return NoticeHandler{Recoverer: f.r, Backend: taskassignment.BackendProcess, Executors: f.backend, Retry: 50 * time.Millisecond}
}

func notice(t *testing.T, id string) []byte {
	t.Helper()
	return []byte(id) // assignmentqueue.Finished publishes the assignment ID as it is
}

func TestNoticeOfAFinishedExecutor(t *testing.T) {
	f := setup(t)
	n := f.notices()
	a := f.claimed(t, 1, true)
	f.setPhase(a, executor.PhaseSucceeded)

	if d := n.Handle(context.Background(), notice(t, a.ID)); d.Outcome != taskassignment.NoticeFinished || d.Assignment != a.ID {
		t.Fatalf("Handle() = %+v", d)
	}
	if f.gitea.reported[1] != executor.PhaseSucceeded {
		t.Fatalf("reported = %v", f.gitea.reported)
	}
	if e, _ := f.backend.Find(context.Background(), a.ID); e != nil || f.hasPayload(t, a.ID) {
		t.Fatalf("executor %v, payload %v left", e != nil, f.hasPayload(t, a.ID))
	}
	// A notice of an executor already gone (the pass, or the notice's own
	// earlier delivery, got there first) is answered the same way.
	for _, id := range []string{a.ID, "linux-2"} {
		if d := n.Handle(context.Background(), notice(t, id)); d.Outcome != taskassignment.NoticeAbsent {
			t.Fatalf("Handle() of %s, no executor = %+v", id, d)
		}
	}
}

func TestNoticeOfAnExecutorNotEndedYetIsRetried(t *testing.T) {
	f := setup(t)
	n := f.notices()
	a := f.claimed(t, 1, true)
	f.setPhase(a, executor.PhaseRunning) // the runner reported, and is still exiting

	if d := n.Handle(context.Background(), notice(t, a.ID)); d.Outcome != taskassignment.NoticeRetry || d.RetryAfter != n.Retry {
		t.Fatalf("Handle() = %+v, want a retry after %v", d, n.Retry)
	}
	if e, _ := f.backend.Find(context.Background(), a.ID); e == nil || !f.hasPayload(t, a.ID) || len(f.gitea.reported) != 0 {
		t.Fatal("a running executor was touched")
	}
	n.Retry = 0
	if d := n.Handle(context.Background(), notice(t, a.ID)); d.RetryAfter != DefaultNoticeRetry {
		t.Fatalf("Handle() without Retry = %+v, want a retry after %v", d, DefaultNoticeRetry)
	}
	f.setPhase(a, executor.PhaseFailed) // it has exited now
	if d := n.Handle(context.Background(), notice(t, a.ID)); d.Outcome != taskassignment.NoticeFinished {
		t.Fatalf("Handle() once ended = %+v", d)
	}
	if f.gitea.reported[1] != executor.PhaseFailed || f.hasPayload(t, a.ID) {
		t.Fatalf("reported %v, payload %v", f.gitea.reported, f.hasPayload(t, a.ID))
	}
}

func TestMalformedOrForeignNoticeIsDropped(t *testing.T) {
	f := setup(t)
	n := f.notices()
	for _, body := range []string{"not an assignment", "windows-3"} { // windows: no pool of this backend
		d := n.Handle(context.Background(), []byte(body))
		if d.Outcome != taskassignment.NoticeDropped || d.Reason == "" || d.Err == nil {
			t.Fatalf("Handle(%q) = %+v, want dropped with a reason", body, d)
		}
	}
}

// Once the run is shutting down no Finish starts: the notice goes back at
// once, for another run.
func TestNoticeWhileShuttingDownIsHandedBack(t *testing.T) {
	f := setup(t)
	n := f.notices()
	n.Retry = time.Hour
	a := f.claimed(t, 1, true)
	f.setPhase(a, executor.PhaseSucceeded)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if d := n.Handle(ctx, notice(t, a.ID)); d.Outcome != taskassignment.NoticeRetry || d.RetryAfter != 0 {
		t.Fatalf("Handle() shutting down = %+v, want a retry at once", d)
	}
	if e, _ := f.backend.Find(context.Background(), a.ID); e == nil || len(f.gitea.reported) != 0 {
		t.Fatal("the executor was touched after shutdown")
	}
}
