package recoverer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// DeadLetter ends the task of an assignment the Knative path will deliver no
// more: the channel dead-lettered it after its last retry, or handle refused
// it for good and said so in a reply event. It is the Knative path's
// counterpart of Drain, with the same steps (Drain's 1-3), guarded because
// neither event is signed by whoever says the assignment failed (the channel
// relays them; only the assignment inside is authenticated):
//
//   - a task whose executor has fetched it (the payload's started mark), or
//     whose executor is running or has ended, is left to the pass
//     (taskassignment.DeadLetterHeld): a lost answer, or a forged dead letter replaying an
//     authentic assignment, never ends a job that runs;
//   - otherwise the task is reported failed with reason as the job's last
//     log row (a task Gitea already ended is left as it is), marked ended,
//     its executor deleted if one waits (a Pod still pending, a process
//     record whose runner never started) and its payload deleted, which
//     frees its capacity.
//
// a must be authenticated and decoded by the caller. reason is shown to the
// job's users: it must hold no credential. Every step is idempotent: an
// error leaves the payload, and the task, for the next delivery of the dead
// letter or, failing that, for the orphan step, which re-sends the
// assignment once its grace is over.
func (r *Recoverer) DeadLetter(ctx context.Context, a taskassignment.Assignment, reason string) (taskassignment.DeadLetterOutcome, error) {
	log := r.log().With(slog.String("assignment", a.ID), slog.Int64("task", a.Task.ID))
	held, err := r.taken(ctx, a.ID)
	if err != nil {
		return 0, fmt.Errorf("dead letter %s: %w", a.ID, err)
	}
	if held {
		log.Info("dead-lettered assignment is in an executor's hands: left to the pass")
		return taskassignment.DeadLetterHeld, nil
	}
	err = r.failTask(ctx, a.ID, string(a.Backend), reason)
	switch {
	case errors.Is(err, errLeft), errors.Is(err, errForeign):
		log.Warn("dead-lettered assignment not for this recover: left alone", slog.Any("error", err))
		return taskassignment.DeadLetterLeft, nil
	case err != nil:
		return 0, fmt.Errorf("dead letter %s: %w", a.ID, err)
	}
	log.Warn("task failed: the Knative path gave up on its assignment", slog.String("reason", reason))
	return taskassignment.DeadLetterFailed, nil
}

// taken reports whether an executor has taken assignment id: its runner
// fetched the task, or the backend holds an executor past pending.
func (r *Recoverer) taken(ctx context.Context, id string) (bool, error) {
	started, err := r.Payloads.Started(ctx, id)
	if err != nil {
		return false, err
	}
	if started {
		return true, nil
	}
	e, err := r.executorOf(ctx, id)
	if err != nil {
		return false, err
	}
	return e != nil && e.Phase != executor.PhasePending, nil
}
