package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// DeadLetterOutcome is what DeadLetter made of an assignment the Knative
// path gave up on.
type DeadLetterOutcome int

const (
	// DeadLetterFailed: the task was reported failed with the reason, its
	// executor (none, normally) and payload deleted.
	DeadLetterFailed DeadLetterOutcome = iota
	// DeadLetterHeld: an executor holds the assignment (accepted, its answer
	// lost): the pass owns its end; nothing was failed.
	DeadLetterHeld
	// DeadLetterLeft: the assignment's pool is not configured here, or its
	// backend is not the pool's; nothing was done.
	DeadLetterLeft
)

func (o DeadLetterOutcome) String() string {
	switch o {
	case DeadLetterFailed:
		return "failed"
	case DeadLetterHeld:
		return "held"
	case DeadLetterLeft:
		return "left"
	}
	return "unknown"
}

// DeadLetter ends the task of an assignment the Knative path will deliver no
// more: the channel dead-lettered it after its last retry, or handle refused
// it for good and said so in a reply event. It is the Knative path's
// counterpart of Drain, with the same steps (Drain's 1-3) and the same guard:
//
//   - an assignment an executor holds is left to the pass (DeadLetterHeld),
//     so that a lost answer, or a forged dead letter replaying an authentic
//     assignment, never ends a job that runs;
//   - otherwise the task is reported failed with reason as the job's last
//     log row (a task Gitea already ended is left as it is), marked ended,
//     and its payload deleted, which frees its capacity.
//
// a must be authenticated and decoded by the caller. reason is shown to the
// job's users: it must hold no credential. Every step is idempotent: an
// error leaves the payload, and the task, for the next delivery of the dead
// letter or, failing that, for the orphan step, which re-sends the
// assignment once its grace is over.
func (r *Recovery) DeadLetter(ctx context.Context, a taskassignment.Assignment, reason string) (DeadLetterOutcome, error) {
	log := r.log().With(slog.String("assignment", a.ID), slog.Int64("task", a.Task.ID))
	held, err := r.heldByBackend(ctx, a.ID)
	if err != nil {
		return 0, fmt.Errorf("dead letter %s: %w", a.ID, err)
	}
	if held {
		log.Info("dead-lettered assignment has an executor: left to the pass")
		return DeadLetterHeld, nil
	}
	err = r.failTask(ctx, a.ID, string(a.Backend), reason)
	switch {
	case errors.Is(err, errLeft), errors.Is(err, errForeign):
		log.Warn("dead-lettered assignment not for this recover: left alone", slog.Any("error", err))
		return DeadLetterLeft, nil
	case err != nil:
		return 0, fmt.Errorf("dead letter %s: %w", a.ID, err)
	}
	log.Warn("task failed: the Knative path gave up on its assignment", slog.String("reason", reason))
	return DeadLetterFailed, nil
}
