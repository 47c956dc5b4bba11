package recoverer

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// sink records what the Knative path's sender was given; it fails while
// fail is set.
type sink struct {
	mu   sync.Mutex
	sent []string
	fail error
}

func (s *sink) Send(_ context.Context, a taskassignment.Assignment) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.sent = append(s.sent, a.ID)
	return nil
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}

// knative is the fixture as recover runs on the Knative path: no queue to
// read, a CloudEvents sink, send marks in the payload bucket and a clock the
// test moves.
func knative(t *testing.T, grace time.Duration) (fixture, *sink, *time.Time) {
	t.Helper()
	f := setup(t)
	s := &sink{}
	now := time.Now()
	f.r.Queue, f.r.Sender, f.r.SendMarks, f.r.OrphanGrace = nil, s, f.payloads, grace
	f.r.Now = func() time.Time { return now }
	return f, s, &now
}

// TestKnativeOrphansGoByTheLastSend: with no queue to ask, a payload
// without an executor is re-sent once its assignment was last sent longer
// than the grace ago, once per grace (never once per pass); a payload with
// an executor, or of a task Gitea ended, is never re-sent.
func TestKnativeOrphansGoByTheLastSend(t *testing.T) {
	f, s, now := knative(t, time.Hour)
	ctx := context.Background()
	orphan := f.claimed(t, 1, false)
	f.claimed(t, 2, true) // running: has its executor
	f.claimed(t, 3, false)
	f.gitea.over[3] = true // ended while it waited

	pass := func() Summary {
		t.Helper()
		sum, err := f.r.Run(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	if sum := pass(); sum.Republished != 0 || s.count() != 0 {
		t.Fatalf("within the grace: %+v, %d sent; want nothing re-sent", sum, s.count())
	}
	*now = now.Add(time.Hour + time.Second)
	sum := pass()
	if sum.Republished != 1 || s.count() != 1 || s.sent[0] != orphan.ID {
		t.Fatalf("after the grace: %+v, sent %v; want %s re-sent once", sum, s.sent, orphan.ID)
	}
	if sum.PayloadsDeleted != 1 || f.hasPayload(t, "linux-3") {
		t.Fatalf("the ended task's payload: %+v, still there %v; want it deleted", sum, f.hasPayload(t, "linux-3"))
	}
	// The mark holds the next passes back for one grace. (Its time is the
	// server's, not the test's clock: move the clock from there.)
	last, err := f.payloads.LastSent(ctx, orphan.ID)
	if err != nil {
		t.Fatal(err)
	}
	*now = last.Add(time.Minute)
	if sum := pass(); sum.Republished != 0 {
		t.Fatalf("a minute after its re-send: %+v; want it left", sum)
	}
	*now = last.Add(time.Hour + time.Second)
	if sum := pass(); sum.Republished != 1 || s.count() != 2 {
		t.Fatalf("a grace after its re-send: %+v, %d sent; want a second send", sum, s.count())
	}
}

// TestKnativeFailedSendIsNotMarked: a send that fails leaves no mark, so the
// next pass tries again at once, and the error says which assignment.
func TestKnativeFailedSendIsNotMarked(t *testing.T) {
	f, s, now := knative(t, time.Minute)
	orphan := f.claimed(t, 1, false)
	*now = now.Add(2 * time.Minute)
	s.fail = errors.New("sink answered 503")
	if _, err := f.r.Run(context.Background()); err == nil || !strings.Contains(err.Error(), orphan.ID) {
		t.Fatalf("Run = %v, want an error naming %s", err, orphan.ID)
	}
	s.fail = nil
	if sum, err := f.r.Run(context.Background()); err != nil || sum.Republished != 1 {
		t.Fatalf("next pass: %+v, %v; want the orphan re-sent", sum, err)
	}
}

// TestDeadLetter: a dead-lettered assignment that no executor has taken
// fails its task with the reason, deletes an executor still pending and
// frees the payload; one whose runner fetched its task, or whose executor
// runs, is left running; one of a pool not configured here, or whose backend
// is not its pool's, is left alone; a Gitea failure is an error and leaves
// the payload.
func TestDeadLetter(t *testing.T) {
	for _, tc := range []struct {
		name        string
		executor    executor.Phase // "" for none
		started     bool
		edit        func(a *taskassignment.Assignment)
		failReports int
		want        taskassignment.DeadLetterOutcome
		wantErr     bool
		failed      bool
	}{
		{name: "waiting", want: taskassignment.DeadLetterFailed, failed: true},
		{name: "executor pending (no node yet)", executor: executor.PhasePending, want: taskassignment.DeadLetterFailed, failed: true},
		{name: "executor running", executor: executor.PhaseRunning, want: taskassignment.DeadLetterHeld},
		{name: "executor ended", executor: executor.PhaseSucceeded, want: taskassignment.DeadLetterHeld},
		{name: "task fetched by its runner", executor: executor.PhasePending, started: true, want: taskassignment.DeadLetterHeld},
		{name: "pool not here", edit: func(a *taskassignment.Assignment) { a.ID, a.Task.Pool = "arm-1", "arm" }, want: taskassignment.DeadLetterLeft},
		{name: "another backend", edit: func(a *taskassignment.Assignment) { a.Backend = taskassignment.BackendPod }, want: taskassignment.DeadLetterLeft},
		{name: "gitea down", failReports: 1, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, g := withRejections(t)
			g.failReports = tc.failReports
			a := f.claimed(t, 1, tc.executor != "")
			if tc.executor != "" {
				f.setPhase(a, tc.executor)
			}
			if tc.started {
				if err := f.payloads.MarkStarted(context.Background(), a.ID); err != nil {
					t.Fatal(err)
				}
			}
			if tc.edit != nil {
				tc.edit(&a)
			}
			got, err := f.r.DeadLetter(context.Background(), a, "handle refused its assignment: no profile")
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), a.ID) {
					t.Fatalf("DeadLetter = %v, %v; want an error naming %s", got, err, a.ID)
				}
				if !f.hasPayload(t, "linux-1") {
					t.Fatal("payload gone after a failed report: nothing would fail the task again")
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("DeadLetter = %v, %v; want %v", got, err, tc.want)
			}
			reason, reported := g.reasons[1]
			if reported != tc.failed {
				t.Fatalf("task reported: %v, want %v", reported, tc.failed)
			}
			e, _ := f.backend.Find(context.Background(), "linux-1")
			if tc.failed {
				if !strings.Contains(reason, "no profile") {
					t.Errorf("reason %q does not carry the dead letter's", reason)
				}
				if f.gitea.reported[1] != executor.PhaseFailed {
					t.Errorf("task reported %v, want failed", f.gitea.reported[1])
				}
				if f.hasPayload(t, "linux-1") {
					t.Error("payload still stored after the task failed")
				}
				if e != nil {
					t.Errorf("executor %s (%s) left after its task failed", e.Name, e.Phase)
				}
				return
			}
			if !f.hasPayload(t, "linux-1") {
				t.Error("payload deleted though nothing was failed")
			}
			if tc.executor != "" && e == nil {
				t.Error("the executor was deleted by a dead letter that failed nothing")
			}
		})
	}
}
