package recoverer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// DefaultNoticeRetry is NoticeHandler's Retry where it is zero: a runner
// that has reported its result exits at once; its executor's phase follows
// within a second or two (the kubelet's status update). With
// taskassignment.FinishedMaxDeliver it covers about 8 s.
const DefaultNoticeRetry = 2 * time.Second

// errShuttingDown is the cause of a notice handed back unfinished.
var errShuttingDown = errors.New("shutting down")

// NoticeHandler is recover's finish mode for one backend: it runs Finish for
// the assignment a finish notice (assignmentqueue.Finished) names, so that
// an executor whose runner reported its final result is reported, deleted
// and its payload deleted (its slot freed) within seconds, not on the next
// periodic pass. Its adapter (shared/trigger/pull.Notices) fetches the
// notices and settles each by its decision.
//
// A notice is unauthenticated: all it does is make Finish look at one
// executor now. Finish acts only on what it reads from Gitea and the backend,
// and never creates an executor, so a forged or early notice changes nothing,
// and a run may go side by side with the periodic pass (see the package doc).
type NoticeHandler struct {
	Recoverer *Recoverer
	Backend   taskassignment.BackendKind
	// Executors is the backend's executors, found one at a time.
	Executors FinishBackend
	// Retry is when a notice whose executor has not ended yet comes back,
	// from the Finish that found it running (zero: DefaultNoticeRetry).
	Retry time.Duration
}

// Handle decides one notice. A malformed one, or one of no pool of this
// backend, is dropped; once ctx has ended no Finish starts and the notice is
// retried at once (for another run). Otherwise Finish runs: no executor is
// NoticeAbsent, an executor finished NoticeFinished, one not ended yet (or a
// Finish that failed) NoticeRetry after Retry (taskassignment's outcomes).
//
// Crash window: a run killed between Finish and its acknowledgement settles
// nothing; the notice comes back after the consumer's AckWait to a Finish
// that finds no executor: taskassignment.NoticeAbsent.
func (n NoticeHandler) Handle(ctx context.Context, body []byte) taskassignment.NoticeDecision {
	if n.Recoverer == nil || n.Executors == nil {
		return taskassignment.NoticeDecision{Outcome: taskassignment.NoticeRetry, RetryAfter: cmp.Or(n.Retry, DefaultNoticeRetry),
			Err: errors.New("recoverer: notices need a recovery and a backend")}
	}
	id, err := taskassignment.FinishedNotice(body)
	if err != nil {
		return taskassignment.NoticeDecision{Outcome: taskassignment.NoticeDropped, Reason: "malformed finish notice", Err: err}
	}
	if pool, _, _ := taskassignment.ParseID(id); n.Recoverer.Pools[pool].Backend != n.Backend {
		return taskassignment.NoticeDecision{Assignment: id, Outcome: taskassignment.NoticeDropped, Reason: "finish notice of no pool of this backend", Err: fmt.Errorf("pool %q", pool)}
	}
	if ctx.Err() != nil {
		return taskassignment.NoticeDecision{Assignment: id, Outcome: taskassignment.NoticeRetry, Err: errShuttingDown}
	}
	fs, err := n.Recoverer.Finish(ctx, n.Executors, id)
	switch {
	case err == nil && fs.Executors == 0:
		// Another Finish or a pass got there first, or the notice is early
		// for an executor not created yet (Accept creates it; its end comes
		// with a notice of its own, or the pass).
		return taskassignment.NoticeDecision{Assignment: id, Outcome: taskassignment.NoticeAbsent}
	case err == nil && fs.Done > 0:
		return taskassignment.NoticeDecision{Assignment: id, Outcome: taskassignment.NoticeFinished}
	}
	// Not ended yet (the runner is still exiting), or Finish failed.
	return taskassignment.NoticeDecision{Assignment: id, Outcome: taskassignment.NoticeRetry, RetryAfter: cmp.Or(n.Retry, DefaultNoticeRetry), Err: err}
}

// Listed returns b as a FinishBackend: b itself when it rebuilds the
// assignment of one executor (RecoverAssignment), else an adapter that lists
// every executor of b (RecoverAssignments) and picks the one asked for; that
// costs one list per notice (for the pod backend, one label-selected list of
// the namespace's executor Pods).
func Listed(b executor.Backend) FinishBackend {
	if f, ok := b.(FinishBackend); ok {
		return f
	}
	return listed{b}
}

type listed struct{ executor.Backend }

func (l listed) RecoverAssignment(ctx context.Context, assignmentID string) (taskassignment.Assignment, bool, error) {
	all, err := l.RecoverAssignments(ctx)
	if err != nil {
		return taskassignment.Assignment{}, false, err
	}
	for _, a := range all {
		if a.ID == assignmentID {
			return a, true, nil
		}
	}
	return taskassignment.Assignment{}, false, nil
}

var _ FinishBackend = listed{}
