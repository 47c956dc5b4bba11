package executor

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// The recorder remembers end marks too, journaled with the other calls.
func (r *recorder) MarkEnded(_ context.Context, id string) error {
	r.calls = append(r.calls, "mark-ended")
	if err := r.fail["mark-ended"]; err != nil {
		return err
	}
	if r.ended == nil {
		r.ended = map[string]bool{}
	}
	r.ended[id] = true
	return nil
}

// The recorder discards too (a Discarder, as the pod backend is).
func (r *recorder) Discard(_ context.Context, id string) error {
	r.calls = append(r.calls, "discard:"+id)
	return r.fail["discard"]
}

func (r *recorder) Ended(_ context.Context, id string) (bool, error) {
	r.calls = append(r.calls, "ended?")
	return r.ended[id], r.fail["ended?"]
}

// TestAcceptAfterTheTaskEnded is the duplicate the chaos run found: a handle
// run creates the executor and dies before its ack (or its ack is lost in a
// NATS restart); the job runs and reports; recover sees the task over and
// deletes the executor; AckWait later the message comes back. With Endings,
// Accept finds the end mark and creates nothing; without, it creates a second
// executor for a task that is over.
func TestAcceptAfterTheTaskEnded(t *testing.T) {
	for _, tc := range []struct {
		name        string
		endings     bool
		ending      func(r *recorder) // how the task ends before the redelivery
		wantCreates int
	}{
		{"reported by recover", true, func(r *recorder) { r.executors["linux-42"].Phase = PhaseSucceeded }, 1},
		{"cancelled in Gitea", true, func(r *recorder) { r.terminal = true }, 1},
		{"without endings: created again", false, func(r *recorder) { r.executors["linux-42"].Phase = PhaseSucceeded }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, rec, a, events := fixture(t)
			if tc.endings {
				w.Endings = rec
			}
			rec.createdTarget = "node-1"
			ctx := context.Background()
			if ok, err := w.Accept(ctx, a); !ok || err != nil { // killed before its ack
				t.Fatalf("first Accept = %v, %v", ok, err)
			}
			tc.ending(rec)
			if done, err := w.Finish(ctx, a); !done || err != nil {
				t.Fatalf("Finish = %v, %v", done, err)
			}
			// The redelivery: accepted either way (acknowledged), with or without a new executor.
			if ok, err := w.Accept(ctx, a); !ok || err != nil {
				t.Fatalf("redelivered Accept = %v, %v", ok, err)
			}
			if n := countCalls(rec.calls, "create"); n != tc.wantCreates {
				t.Errorf("executor created %d times, want %d (calls %v)", n, tc.wantCreates, rec.calls)
			}
			ended := slices.ContainsFunc(*events, func(e Event) bool { return e.Name == EventTaskEnded })
			if ended != tc.endings {
				t.Errorf("event %s emitted: %v, want %v", EventTaskEnded, ended, tc.endings)
			}
		})
	}
}

// Finish marks the task ended before it deletes the executor: a redelivery
// whose Find no longer sees the executor then always sees the mark. A mark
// that cannot be written keeps the executor (Finish is called again).
func TestFinishMarksEndedBeforeDeleting(t *testing.T) {
	for _, tc := range []struct {
		name      string
		terminal  bool
		phase     Phase
		failMark  bool
		wantCalls []string
		wantDone  bool
	}{
		{"reported", false, PhaseSucceeded, false, []string{"terminal:42", "find", "bind:node-1:" + spiffeID, "report:42:succeeded", "mark-ended", "delete:exec-linux-42"}, true},
		{"over in Gitea", true, PhaseRunning, false, []string{"terminal:42", "find", "mark-ended", "delete:exec-linux-42"}, true},
		{"mark fails", true, PhaseRunning, true, []string{"terminal:42", "find", "mark-ended"}, false},
		// Find sees nothing (a Pod whose Secret was never created): what is
		// left is discarded, since no Accept will complete it any more.
		{"over in Gitea, nothing found", true, "", false, []string{"terminal:42", "find", "mark-ended", "discard:linux-42"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, rec, a, _ := fixture(t)
			w.Endings = rec
			rec.terminal = tc.terminal
			if tc.phase != "" {
				rec.has(a, "node-1", tc.phase)
			}
			if tc.failMark {
				rec.fail["mark-ended"] = errBoom
			}
			done, err := w.Finish(context.Background(), a)
			if done != tc.wantDone || (err != nil) != tc.failMark {
				t.Fatalf("Finish = %v, %v", done, err)
			}
			if tc.failMark && !errors.Is(err, errBoom) {
				t.Errorf("Finish error %v does not wrap the mark's", err)
			}
			if !slices.Equal(rec.calls, tc.wantCalls) {
				t.Errorf("calls\n got %v\nwant %v", rec.calls, tc.wantCalls)
			}
		})
	}
}

// An end mark that cannot be read is a transient failure: nothing is
// created, the message comes back.
func TestAcceptWhenEndingsFail(t *testing.T) {
	w, rec, a, _ := fixture(t)
	w.Endings = rec
	rec.fail["ended?"] = errBoom
	ok, err := w.Accept(context.Background(), a)
	if ok || !errors.Is(err, errBoom) {
		t.Fatalf("Accept = %v, %v; want the read's error", ok, err)
	}
	if n := countCalls(rec.calls, "create"); n != 0 {
		t.Errorf("created %d executors without knowing whether the task is over", n)
	}
}

func countCalls(calls []string, name string) int {
	return len(slices.DeleteFunc(slices.Clone(calls), func(c string) bool { return c != name }))
}
