package taskworker

import (
	"context"
	"slices"
	"testing"
)

// TestAcceptRedeliveredAfterTheTaskEnded is the duplicate the chaos run
// (internal/chaos, issue 13) finds: a handle run creates the executor and is
// killed before its ack (or its ack is lost in a NATS restart); the job runs
// and reports; recover sees the task over in Gitea and deletes the executor
// and the payload; AckWait after the first delivery the message comes back,
// and Accept, finding no executor, creates a second one for a task that is
// over. The fix belongs to whoever owns the hand-off (intake / Worker.Accept,
// or recover removing the finished assignment's message): this test only
// states the invariant. It fails on the code it was written against.
func TestAcceptRedeliveredAfterTheTaskEnded(t *testing.T) {
	w, rec, a, _ := fixture(t)
	rec.createdTarget = "node-1"
	ctx := context.Background()

	// handle run 1: creates the executor and binds it; killed before its ack.
	if ok, err := w.Accept(ctx, a); !ok || err != nil {
		t.Fatalf("first Accept = %v, %v", ok, err)
	}
	// The job runs and reports; recover finds the task over and cleans up.
	rec.terminal = true
	rec.has(a, "node-1", PhaseSucceeded)
	if done, err := w.Handle(ctx, a); !done || err != nil {
		t.Fatalf("Handle = %v, %v", done, err)
	}
	// AckWait later the unacknowledged message comes back to handle run 2.
	_, _ = w.Accept(ctx, a)

	if creates := countCalls(rec.calls, "create"); creates != 1 {
		t.Errorf("assignment %s: executor created %d times: a redelivery after the task ended re-created it (calls %v)",
			a.ID, creates, rec.calls)
	}
}

func countCalls(calls []string, name string) int {
	return len(slices.DeleteFunc(slices.Clone(calls), func(c string) bool { return c != name }))
}
