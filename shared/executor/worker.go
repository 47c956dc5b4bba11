// Package executor is the executor contract and its reconciler: what a
// backend does with executors (Backend: find, create, bind an identity,
// delete, list), what it reports of one (Executor, Phase), its refusals
// (Permanent), and the Worker that reconciles an assigned Gitea task against
// its executor (Accept from handle, Finish from recover). The words
// executor, runner and worker mean what docs/ARCHITECTURE.md's "Words" says.
//
// The Worker holds no state that correctness depends on: every fact it acts on
// is read again from the backend (the executor and its metadata) and from
// Gitea (whether the task is over). Any call may be repeated after a crash at
// any point and converges to the same end.
package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// Phase is the state of an executor as its backend observes it. The worker
// never stores it.
type Phase string

const (
	PhasePending   Phase = "pending"
	PhaseRunning   Phase = "running"
	PhaseSucceeded Phase = "succeeded"
	PhaseFailed    Phase = "failed"
	// PhaseUnknown is a state the backend cannot tell (a lost node, an
	// executor being deleted). It is not terminal.
	PhaseUnknown Phase = "unknown"
)

// Terminal reports whether the executor has finished for good.
func (p Phase) Terminal() bool { return p == PhaseSucceeded || p == PhaseFailed }

// Executor is a backend resource found by its assignment ID.
type Executor struct {
	// Name identifies the resource within its backend.
	Name string
	// IdentityTarget is what the identity is bound to (a node UID, a sandbox
	// ID); empty until the backend can tell, for example before scheduling.
	IdentityTarget string
	Phase          Phase
	// Reason says why a failed executor failed, when the backend can tell
	// (an image that cannot be pulled); it reaches the job's log. Never a
	// credential.
	Reason string
}

// LaunchSpec is everything a backend needs to create an executor beyond the
// assignment itself. Environment carries credentials: a backend passes it to
// the executor only, never into metadata, events, logs or errors.
type LaunchSpec struct {
	Metadata    taskassignment.Metadata
	Environment map[string]string
}

// Bootstrap yields the executor environment of an assignment. It must be
// deterministic: a redelivery after a crash creates the same credentials
// without any stored record.
type Bootstrap interface {
	Environment(taskassignment.Assignment) (map[string]string, error)
}

// Backend is the one interface every executor backend implements: handle's
// Worker.Accept and recover's Worker.Finish use the executor of one
// assignment (Find, Create, BindIdentity, Delete), recover's pass lists them
// all (RecoverAssignments). Every method must be idempotent: Create for an
// assignment that already has an executor returns that executor,
// BindIdentity for a bound identity succeeds, and Delete of a deleted
// executor succeeds.
type Backend interface {
	// Find returns the executor of the assignment ID, or nil without error
	// when there is none.
	Find(ctx context.Context, assignmentID string) (*Executor, error)
	Create(ctx context.Context, a taskassignment.Assignment, spec LaunchSpec) (*Executor, error)
	BindIdentity(ctx context.Context, e *Executor, id taskidentity.Identity) error
	Delete(ctx context.Context, e *Executor) error
	// RecoverAssignments returns one assignment per executor of this
	// installation (the keys' runner marker), rebuilt from the executor's
	// metadata alone. An executor whose metadata does not rebuild
	// (corrupt, another trust domain) is skipped and reported by the
	// backend; it never fails the whole list.
	RecoverAssignments(ctx context.Context) ([]taskassignment.Assignment, error)
}

// TaskState asks Gitea, the authority, about a task. Both methods must be
// idempotent: a task that is already over answers its final result.
type TaskState interface {
	// Terminal reports whether Gitea considers the task finished (done or
	// cancelled).
	Terminal(ctx context.Context, taskID int64) (bool, error)
	// Report records the executor's final phase as the task's result.
	Report(ctx context.Context, taskID int64, executor Executor) error
}

// Worker moves one assignment towards its end on one backend.
type Worker struct {
	Backend   Backend
	Tasks     TaskState
	Bootstrap Bootstrap
	// Keys are the metadata keys the executors are created with.
	Keys taskassignment.Keys
	// Endings remembers the assignments whose task is over. Finish marks an
	// assignment ended before it deletes its executor, and Accept consults
	// the mark before it creates one: a queue message delivered again after
	// its task ended (a handle killed before its ack, an ack lost in a NATS
	// restart) then creates nothing. Without Endings such a redelivery
	// creates a second executor for a task that is over.
	Endings Endings
	// OnEvent, if set, receives every lifecycle transition. It is called
	// synchronously and must not block.
	OnEvent func(Event)
}

// Discarder is implemented by a backend whose Create can leave part of an
// executor that Find does not return (the pod backend: a Pod whose Secret was
// never created, a handle killed between the two). Once the task is over,
// Finish discards it when Find found nothing: no later Create will complete
// it, since Accept creates nothing for an ended assignment. Discard of
// nothing succeeds.
type Discarder interface {
	Discard(ctx context.Context, assignmentID string) error
}

// Endings remembers which assignments are over (assignmentqueue.Endings).
// A mark, once written, must be seen by every later Ended.
type Endings interface {
	MarkEnded(ctx context.Context, assignmentID string) error
	Ended(ctx context.Context, assignmentID string) (bool, error)
}

// Accept completes the hand-off from the queue to the backend: it finds or
// creates the executor, waits for its identity target and binds its identity.
// True means every fact recovery needs is now held by the backend, and the
// queue message may be acknowledged. False without error means "not yet"
// (the identity target is pending): deliver the message again later.
//
// An assignment that has no executor and is marked ended (see Endings) is
// over: Accept creates nothing and answers true, so its message is
// acknowledged. The mark is read after Find: Finish writes it before it
// deletes an executor, so a Find that no longer sees an executor Finish
// deleted is always followed by a read that sees its mark.
func (w Worker) Accept(ctx context.Context, a taskassignment.Assignment) (bool, error) {
	if w.Backend == nil || w.Bootstrap == nil || w.Keys.Runner == "" {
		return false, errors.New("executor: backend, bootstrap and metadata keys are required")
	}
	if err := checkAssignment(a); err != nil {
		return false, err
	}
	executor, err := w.Backend.Find(ctx, a.ID)
	if err != nil {
		return false, fmt.Errorf("find executor of assignment %s: %w", a.ID, err)
	}
	if executor == nil {
		w.emit(EventExecutorAbsent, a, nil)
		if w.Endings != nil {
			ended, err := w.Endings.Ended(ctx, a.ID)
			if err != nil {
				return false, fmt.Errorf("assignment %s: is its task over: %w", a.ID, err)
			}
			if ended {
				w.emit(EventTaskEnded, a, nil)
				return true, nil
			}
		}
		if executor, err = w.create(ctx, a); err != nil {
			return false, err
		}
		w.emit(EventExecutorCreated, a, executor)
	} else {
		w.emit(EventExecutorFound, a, executor)
	}
	return w.bind(ctx, a, executor)
}

// Finish finishes an assignment's executor once its job is over, in one
// reconciliation (recover's pass and finish mode call it; Accept is
// handle's).
// If Gitea says the task is over, the executor is deleted (this is how
// cancellations clean up). Otherwise its identity is bound, and an executor
// that Succeeded or Failed is reported to Gitea BEFORE it is deleted, so a
// crash between the two can never let the task run a second time. Done means
// nothing is left to do for the assignment; false means call again later.
//
// Finish never creates an executor: an absent one emits EventExecutorAbsent
// and returns not done, without error. Only Accept creates executors, from a
// queue message. The absent case is reached by a race: a caller listed the
// executor, a concurrent Finish reported and deleted it, and Gitea does not
// show the task as over yet. Creating it again would start the executor of a
// finished job, whose runner could fetch the still-stored payload and run the
// job a second time. Left absent, the payload is an orphan for recover's
// orphan pass (Gitea over: deleted; not over: re-published for Accept). So
// concurrent Finish calls on one assignment converge: each only reports and
// deletes what it finds.
func (w Worker) Finish(ctx context.Context, a taskassignment.Assignment) (done bool, err error) {
	if w.Backend == nil || w.Tasks == nil || w.Bootstrap == nil || w.Keys.Runner == "" {
		return false, errors.New("executor: backend, task state, bootstrap and metadata keys are required")
	}
	if err := checkAssignment(a); err != nil {
		return false, err
	}
	terminal, err := w.Tasks.Terminal(ctx, a.Task.ID)
	if err != nil {
		return false, fmt.Errorf("ask Gitea about task %d: %w", a.Task.ID, err)
	}
	executor, err := w.Backend.Find(ctx, a.ID)
	if err != nil {
		return false, fmt.Errorf("find executor of assignment %s: %w", a.ID, err)
	}
	if terminal {
		w.emit(EventTaskTerminal, a, executor)
		if err := w.markEnded(ctx, a); err != nil {
			return false, err
		}
		if executor != nil {
			if err := w.delete(ctx, a, executor); err != nil {
				return false, err
			}
			return true, nil
		}
		if err := Discard(ctx, w.Backend, a.ID); err != nil {
			return false, err
		}
		return true, nil
	}
	if executor == nil {
		w.emit(EventExecutorAbsent, a, nil)
		return false, nil
	}
	bound, err := w.bind(ctx, a, executor)
	if err != nil || !bound {
		return false, err
	}
	if !executor.Phase.Terminal() {
		return false, nil
	}
	if err := w.Tasks.Report(ctx, a.Task.ID, *executor); err != nil {
		return false, fmt.Errorf("report task %d as %s: %w", a.Task.ID, executor.Phase, err)
	}
	w.emit(EventTaskReported, a, executor)
	if err := w.markEnded(ctx, a); err != nil {
		return false, err
	}
	if err := w.delete(ctx, a, executor); err != nil {
		return false, err
	}
	return true, nil
}

// Discard discards what b may hold of assignmentID's executor when b is a
// Discarder (see Discarder); otherwise it does nothing.
func Discard(ctx context.Context, b Backend, assignmentID string) error {
	d, ok := b.(Discarder)
	if !ok {
		return nil
	}
	if err := d.Discard(ctx, assignmentID); err != nil {
		return fmt.Errorf("discard what is left of the executor of assignment %s: %w", assignmentID, err)
	}
	return nil
}

// markEnded records that a's task is over, before its executor is deleted
// (see Endings); without Endings it does nothing.
func (w Worker) markEnded(ctx context.Context, a taskassignment.Assignment) error {
	if w.Endings == nil {
		return nil
	}
	if err := w.Endings.MarkEnded(ctx, a.ID); err != nil {
		return fmt.Errorf("assignment %s: mark its task over: %w", a.ID, err)
	}
	return nil
}

func checkAssignment(a taskassignment.Assignment) error {
	if a.ID == "" || a.Task.ID <= 0 {
		return fmt.Errorf("executor: assignment %q of task %d is not valid", a.ID, a.Task.ID)
	}
	return nil
}

func (w Worker) create(ctx context.Context, a taskassignment.Assignment) (*Executor, error) {
	env, err := w.Bootstrap.Environment(a)
	if err != nil {
		return nil, fmt.Errorf("bootstrap assignment %s: %w", a.ID, err)
	}
	spec := LaunchSpec{Metadata: w.Keys.Metadata(a), Environment: env}
	executor, err := w.Backend.Create(ctx, a, spec)
	if err != nil {
		return nil, fmt.Errorf("create executor of assignment %s: %w", a.ID, err)
	}
	if executor == nil {
		return nil, fmt.Errorf("create executor of assignment %s: backend returned no executor", a.ID)
	}
	return executor, nil
}

func (w Worker) bind(ctx context.Context, a taskassignment.Assignment, executor *Executor) (bool, error) {
	if executor.IdentityTarget == "" {
		w.emit(EventIdentityTargetPending, a, executor)
		return false, nil
	}
	if err := w.Backend.BindIdentity(ctx, executor, a.Identity); err != nil {
		return false, fmt.Errorf("bind identity of assignment %s to executor %s: %w", a.ID, executor.Name, err)
	}
	w.emit(EventIdentityBound, a, executor)
	return true, nil
}

func (w Worker) delete(ctx context.Context, a taskassignment.Assignment, executor *Executor) error {
	if err := w.Backend.Delete(ctx, executor); err != nil {
		return fmt.Errorf("delete executor %s of assignment %s: %w", executor.Name, a.ID, err)
	}
	w.emit(EventExecutorDeleted, a, executor)
	return nil
}
