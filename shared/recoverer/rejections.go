package recoverer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Rejections is the queue's rejection stream and what Drain does to the
// queue's stream (assignmentqueue.Queue).
type Rejections interface {
	Rejections(ctx context.Context, limit int) ([]taskassignment.Rejection, error)
	RemoveRejection(ctx context.Context, seq uint64) error
	ExhaustedAssignment(ctx context.Context, seq uint64, td spiffeid.TrustDomain) (taskassignment.Assignment, bool, error)
	DeleteMessage(ctx context.Context, seq uint64) error
}

// drainBatch bounds the entries one Drain acts on; the rest wait for the
// next.
const drainBatch = 1000

// errLeft is why an entry stays for the next Drain without anything having
// failed: its pool is not configured here.
var errLeft = errors.New("left for a recover that knows its pool")

// Drain fails the tasks whose assignments handle rejected or ran out of
// deliveries, from the entries of the rejection stream
// (assignmentqueue.Queue.Rejections), oldest first. Run does it first; local
// mode also calls it as soon as a handle run rejected something.
//
// For each entry that names an assignment of a configured pool (a
// termination "permanent <ID>: <why>" or "exhausted <ID>: ...", or a message
// that reached MaxDeliver without one, read back from the queue and
// authenticated), in this order:
//
//  1. the task is reported failed through its pool's TaskState, with the
//     reason as the job's last log row (a task Gitea already ended is left
//     as it is);
//  2. an executor the backend holds for it is deleted;
//  3. its payload is deleted, which frees the task's capacity;
//  4. a message past MaxDeliver is deleted from the queue's stream;
//  5. the entry is removed.
//
// Every step is idempotent and the entry goes last, so a crash or a failure
// (Gitea answering 5xx, a backend down) anywhere leaves the entry for the
// next Drain, which repeats the steps. An entry of a pool not configured
// here is left alone. An entry that names no assignment (a poison message's
// termination, a reason that does not parse, a message past MaxDeliver that
// does not authenticate) is logged and removed: its payload, if any, is an
// orphan that Run re-publishes, signed.
//
// A termination's reason is written by handle (only handle may settle queue
// messages); recover takes its assignment ID on trust but checks that the
// consumer that terminated it is the backend of the ID's pool.
//
// Without Rejections configured, Drain does nothing.
func (r *Recoverer) Drain(ctx context.Context) (Summary, error) {
	sum, _, err := r.drain(ctx)
	return sum, err
}

// drain is Drain, also returning the IDs of the assignments whose entries
// are left for the next pass: their payloads are no orphans.
func (r *Recoverer) drain(ctx context.Context) (Summary, map[string]bool, error) {
	var sum Summary
	pending := map[string]bool{}
	if r.Rejections == nil {
		return sum, pending, nil
	}
	entries, err := r.Rejections.Rejections(ctx, drainBatch)
	for _, e := range entries {
		if ctx.Err() != nil {
			break
		}
		if id := r.drainOne(ctx, e, &sum); id != "" {
			pending[id] = true
		}
	}
	if err != nil {
		return sum, pending, fmt.Errorf("read rejections: %w", err)
	}
	return sum, pending, nil
}

// drainOne acts on one entry and counts the outcome. It returns the
// assignment ID of an entry left for the next pass, when it names one.
func (r *Recoverer) drainOne(ctx context.Context, e taskassignment.Rejection, sum *Summary) (left string) {
	log := r.log().With(slog.Uint64("rejection", e.Seq), slog.String("consumer", e.Consumer), slog.Uint64("stream_seq", e.QueueSeq))
	drop := func(msg string, attrs ...any) {
		log.Warn(msg+"; removed", attrs...)
		if err := r.Rejections.RemoveRejection(ctx, e.Seq); err != nil {
			log.Warn("remove a rejection", slog.Any("error", err))
			sum.RejectionsLeft++
			return
		}
		sum.RejectionsDropped++
	}
	if e.Err != nil {
		drop("rejection entry does not decode", slog.Any("error", e.Err))
		return
	}
	var (
		id, reason string
		exhausted  bool
	)
	switch e.Kind {
	case taskassignment.Terminated:
		var why string
		var ok bool
		if id, why, exhausted, ok = e.Cause(); !ok {
			drop("terminated message names no assignment", slog.String("reason", e.Reason))
			return
		}
		reason = why
		if exhausted {
			reason = exhaustedReason(e.Deliveries)
		}
	case taskassignment.MaxDeliveries:
		a, found, err := r.Rejections.ExhaustedAssignment(ctx, e.QueueSeq, r.TrustDomain)
		switch {
		case errors.Is(err, taskassignment.ErrNotAnAssignment):
			if derr := r.Rejections.DeleteMessage(ctx, e.QueueSeq); derr != nil {
				log.Warn("delete a message past its last delivery", slog.Any("error", derr))
				sum.RejectionsLeft++
				return
			}
			drop("message past its last delivery is not an authentic assignment; deleted", slog.Any("error", err))
			return
		case err != nil:
			log.Warn("read a message past its last delivery", slog.Any("error", err))
			sum.RejectionsLeft++
			return
		case !found:
			drop("message past its last delivery is gone")
			return
		}
		id, reason, exhausted = a.ID, exhaustedReason(e.Deliveries), true
	default:
		drop("rejection entry of an unknown kind", slog.String("kind", string(e.Kind)))
		return
	}
	log = log.With(slog.String("assignment", id))
	if exhausted {
		// An assignment whose executor exists is in the backend's hands
		// (accepted, its ack lost on the last delivery; a handle killed after
		// Create): the pass's Worker.Finish owns its end. Failing the task
		// would end a job that runs.
		held, err := r.heldByBackend(ctx, id)
		if err != nil {
			log.Warn("find the executor of an exhausted assignment; left for the next pass", slog.Any("error", err))
			sum.RejectionsLeft++
			return id
		}
		if held {
			if e.Kind == taskassignment.MaxDeliveries {
				if err := r.Rejections.DeleteMessage(ctx, e.QueueSeq); err != nil {
					log.Warn("delete a message past its last delivery; left for the next pass", slog.Any("error", err))
					sum.RejectionsLeft++
					return id
				}
			}
			drop("assignment ran out of deliveries but its executor exists: left to the pass, not failed")
			return ""
		}
	}
	if err := r.failTask(ctx, id, e.Consumer, reason); err != nil {
		switch {
		case errors.Is(err, errLeft):
			log.Info("rejection of a pool not configured here left alone")
		case errors.Is(err, errForeign):
			drop("rejection does not match its assignment's backend", slog.Any("error", err))
			return
		default:
			log.Warn("fail a rejected task; left for the next pass", slog.Any("error", err))
		}
		sum.RejectionsLeft++
		return id
	}
	if e.Kind == taskassignment.MaxDeliveries {
		if err := r.Rejections.DeleteMessage(ctx, e.QueueSeq); err != nil {
			log.Warn("delete a message past its last delivery; left for the next pass", slog.Any("error", err))
			sum.RejectionsLeft++
			return id
		}
	}
	if err := r.Rejections.RemoveRejection(ctx, e.Seq); err != nil {
		log.Warn("remove a rejection; left for the next pass", slog.Any("error", err))
		sum.RejectionsLeft++
		return id
	}
	if exhausted {
		log.Warn("task failed: its assignment ran out of deliveries", slog.String("reason", reason))
		sum.Exhausted++
	} else {
		log.Warn("task failed: its assignment was rejected", slog.String("reason", reason))
		sum.Rejected++
	}
	return ""
}

// heldByBackend reports whether the backend of assignment id's pool holds an
// executor for it; false for an ID that does not parse or a pool or backend
// not configured here (failTask then says why).
func (r *Recoverer) heldByBackend(ctx context.Context, id string) (bool, error) {
	e, err := r.executorOf(ctx, id)
	return e != nil, err
}

// executorOf returns the executor the backend of assignment id's pool holds
// for it; nil for none, an ID that does not parse, or a pool or backend not
// configured here (failTask then says why).
func (r *Recoverer) executorOf(ctx context.Context, id string) (*executor.Executor, error) {
	pool, _, err := r.poolOf(id)
	if err != nil {
		return nil, nil
	}
	backend, ok := r.Backends[pool.Backend]
	if !ok {
		return nil, nil
	}
	e, err := backend.Find(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("find executor of assignment %s: %w", id, err)
	}
	return e, nil
}

// poolOf returns the configured pool of assignment id and its task ID: an ID
// that does not parse is errForeign, a pool not configured here errLeft.
func (r *Recoverer) poolOf(id string) (Pool, int64, error) {
	poolName, taskID, err := taskassignment.ParseID(id)
	if err != nil {
		return Pool{}, 0, fmt.Errorf("%w: %w", errForeign, err)
	}
	pool, ok := r.Pools[poolName]
	if !ok {
		return Pool{}, 0, fmt.Errorf("pool %q: %w", poolName, errLeft)
	}
	return pool, taskID, nil
}

// errForeign: a termination names an assignment of a pool that another
// backend serves than the consumer that terminated it.
var errForeign = errors.New("terminated by another backend's consumer")

// failTask reports the task of assignment id failed with reason, marks it
// ended (see Recoverer.Endings), then deletes its executor, if any, and its
// payload (steps 1-3 of Drain).
func (r *Recoverer) failTask(ctx context.Context, id, consumer, reason string) error {
	pool, taskID, err := r.poolOf(id)
	if err != nil {
		return err
	}
	if string(pool.Backend) != consumer {
		return fmt.Errorf("assignment %s of pool %s (backend %s): %w %q", id, pool.Name, pool.Backend, errForeign, consumer)
	}
	failed := executor.Executor{Phase: executor.PhaseFailed, Reason: reason}
	if err := pool.Tasks.Report(ctx, taskID, failed); err != nil {
		return fmt.Errorf("report task %d failed: %w", taskID, err)
	}
	if r.Endings != nil {
		if err := r.Endings.MarkEnded(ctx, id); err != nil {
			return fmt.Errorf("assignment %s: mark its task over: %w", id, err)
		}
	}
	if backend, ok := r.Backends[pool.Backend]; ok {
		e, err := backend.Find(ctx, id)
		if err != nil {
			return fmt.Errorf("find executor of assignment %s: %w", id, err)
		}
		if e != nil {
			if err := backend.Delete(ctx, e); err != nil {
				return fmt.Errorf("delete executor %s of assignment %s: %w", e.Name, id, err)
			}
		} else if err := executor.Discard(ctx, backend, id); err != nil {
			return err
		}
	}
	if err := r.Payloads.Delete(ctx, id); err != nil {
		return fmt.Errorf("delete payload of assignment %s: %w", id, err)
	}
	return nil
}

// exhaustedReason is the job log's explanation of a task failed after its
// assignment ran out of deliveries.
func exhaustedReason(deliveries uint64) string {
	if deliveries == 0 {
		return "its assignment ran out of deliveries before an executor took it"
	}
	return fmt.Sprintf("its assignment ran out of deliveries (%d) before an executor took it", deliveries)
}
