// Package recoverer finishes, reports and cleans up whatever the backends
// hold; it is the core of the `recover` function. One Run:
//
//  0. the rejection stream is drained (Drain): every task whose assignment
//     handle rejected (a permanent error) or that ran out of deliveries is
//     reported failed with the reason, its executor and payload deleted;
//  1. every executor a backend holds, rebuilt from its metadata, goes through
//     executor.Worker.Finish with its pool's Gitea registration: Gitea
//     says the task is over -> the executor is deleted (this is how
//     cancellations clean up); the executor Succeeded or Failed -> reported,
//     then deleted. When Handle is done, the task's payload is deleted;
//  2. a payload with neither a queued message nor an executor (a crash
//     between dispatch's payload write and its publish, a message
//     terminated without naming its assignment) is re-published, unless
//     Gitea says the task is over, in which case the payload is deleted, or
//     an executor had taken it (the gateway's started mark: the executor
//     vanished, expired or deleted, without a report), in which case the
//     task is failed with that reason rather than run a second time. A
//     payload whose rejection entry is still pending (step 0 failed for it)
//     is no orphan: it is left for the next drain. On the Knative path
//     (no Queue: the channel's stream cannot be asked) a payload without an
//     executor is an orphan once its last send is OrphanGrace old.
//
// The Knative path has no rejection stream: what its channel gives up on
// reaches DeadLetter instead.
//
// Finish does step 1 for one executor, by its assignment ID, through the same
// code: the fast path for a caller that learns of an executor's end (local
// mode, when an executor process exits), so that a finished task is reported
// and its capacity freed at once. Run stays the safety net for every end
// nobody heard of (a restart, a missed exit, a Finish that failed).
//
// Every step is idempotent: Run and Finish may be repeated after a crash, and
// may run side by side on one assignment, in one process or in several (the
// CronJob pass and recover's finish mode). The invariant that makes this safe:
// only handle creates executors (Worker.Accept, from a queue message); recover
// only reports and deletes (Worker.Finish never creates). A pass that listed
// an executor and asked Gitea just before the job ended, and then finds the
// executor deleted by another, leaves it absent: the payload, if the other
// has not deleted it yet, is an orphan for the orphan step, which deletes it
// once Gitea says the task is over, or re-publishes it for handle if the task
// is really not over. Concurrent passes therefore converge.
package recoverer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskworkflow"
)

// FinishBackend is a backend Finish can handle one executor of.
type FinishBackend interface {
	executor.Backend
	// RecoverAssignment rebuilds the assignment of the executor of
	// assignmentID from its metadata alone, as RecoverAssignments does for
	// every executor; found is false when there is no such executor.
	RecoverAssignment(ctx context.Context, assignmentID string) (a taskassignment.Assignment, found bool, err error)
}

// Pool is a configured pool with its registration's task state.
type Pool struct {
	runnerpool.Pool
	Tasks executor.TaskState
}

// Queue is the assignment queue (assignmentqueue.Queue), read to tell an
// orphan from a payload whose message still waits.
type Queue interface {
	Queued(ctx context.Context, b taskassignment.BackendKind, td spiffeid.TrustDomain) (map[string]bool, int, error)
}

// Sender sends an orphan's assignment again: the JetStream queue
// (assignmentqueue.Queue) or, on the Knative path, the CloudEvents sink
// (assignmentevents.Sender). Both de-duplicate by assignment ID.
type Sender interface {
	Send(ctx context.Context, a taskassignment.Assignment) error
}

// SendMarks remember when an assignment was last sent
// (assignmentqueue.Payloads): on the Knative path the channel that holds the
// messages cannot be asked whether it still holds one, so the orphan step
// goes by time instead.
type SendMarks interface {
	LastSent(ctx context.Context, assignmentID string) (time.Time, error)
	MarkSent(ctx context.Context, assignmentID string) error
}

// Payloads is the payload store (assignmentqueue.Payloads).
type Payloads interface {
	IDs(ctx context.Context) ([]string, error)
	Get(ctx context.Context, assignmentID string) (*runnerv1.Task, error)
	Delete(ctx context.Context, assignmentID string) error
	// Started reports whether the executor of assignmentID has fetched its
	// task (the gateway marks it): DeadLetter never fails such a task.
	Started(ctx context.Context, assignmentID string) (bool, error)
}

// Recoverer scans backends and payloads.
type Recoverer struct {
	TrustDomain spiffeid.TrustDomain
	Keys        taskassignment.Keys
	Bootstrap   executor.Bootstrap
	Backends    map[taskassignment.BackendKind]executor.Backend
	Pools       map[string]Pool
	// Queue, when set, says which assignments still have a message: a
	// payload whose assignment is queued is no orphan. Nil is the Knative
	// path (SendMarks and OrphanGrace decide instead).
	Queue Queue
	// Sender re-sends orphans.
	Sender   Sender
	Payloads Payloads
	// SendMarks and OrphanGrace are the Knative path's orphan rule, used
	// when Queue is nil: a payload without an executor is an orphan once its
	// assignment was last sent more than OrphanGrace ago; re-sending marks it
	// sent, so a task that waits is re-sent once per grace. A grace shorter
	// than the channel's redelivery span repairs a lost send sooner and may
	// send a message the channel still offers again: harmless, since Accept
	// is idempotent (one executor) and the channel drops a repeat within
	// its duplicate window.
	SendMarks   SendMarks
	OrphanGrace time.Duration
	// Now is the clock of the orphan grace; nil is time.Now.
	Now func() time.Time
	// Rejections is the queue's rejection stream (Drain); nil skips the
	// drain.
	Rejections Rejections
	// Endings remembers the assignments whose task is over: every executor
	// recover deletes is marked ended first (executor.Worker.Endings), so
	// that a queue message delivered again later creates no second one. Nil
	// remembers nothing (tests of other paths).
	Endings executor.Endings
	// Concurrency bounds the assignments handled at once (default 8).
	Concurrency int
	Log         *slog.Logger
}

// Summary counts the outcomes of one Run or one Finish.
type Summary struct {
	// Executors found, and what Handle made of them.
	Executors, Done, Pending, Failed int
	// UnknownPool counts executors of a pool not configured here: left alone.
	UnknownPool int
	// Republished payloads that had neither a message nor an executor;
	// PayloadsDeleted of tasks that are over.
	Republished, PayloadsDeleted int
	// Vanished counts tasks failed because their executor took them and
	// then disappeared without a report (see vanishedReason).
	Vanished int
	// Rejected and Exhausted count tasks Drain failed: their assignment was
	// rejected by handle, or ran out of deliveries. RejectionsDropped counts
	// entries that named no assignment, removed; RejectionsLeft entries left
	// for the next pass (a failure, a pool not configured here).
	Rejected, Exhausted, RejectionsDropped, RejectionsLeft int
}

func (r *Recoverer) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

// Run does one pass. Its error means a backend, the payload store or the
// rejection stream could not be listed at all; single assignments that fail
// are counted and logged, and retried by the next Run.
func (r *Recoverer) Run(ctx context.Context) (Summary, error) {
	var (
		mu   sync.Mutex
		errs []error
		seen = map[string]bool{}
	)
	// First: a rejected task's executor and payload are gone before the
	// passes below could handle the one or re-publish the other.
	sum, pending, err := r.drain(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for id := range pending {
		seen[id] = true
	}
	count := func(f func(*Summary)) {
		mu.Lock()
		defer mu.Unlock()
		f(&sum)
	}
	n := r.Concurrency
	if n <= 0 {
		n = 8
	}
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for kind, backend := range r.Backends {
		assignments, err := backend.RecoverAssignments(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("backend %s: list executors: %w", kind, err))
			continue
		}
		for _, a := range assignments {
			seen[a.ID] = true
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				r.handle(ctx, backend, a, count)
			}()
		}
	}
	wg.Wait()
	if err := r.orphans(ctx, seen, &sum); err != nil {
		errs = append(errs, err)
	}
	return sum, errors.Join(errs...)
}

// Finish handles the one executor of assignmentID as Run handles each: Gitea
// says the task is over -> the executor is deleted; the executor finished ->
// reported, then deleted; either way the payload is deleted, which frees the
// task's capacity. The summary counts that one executor (zero when there is
// none: another Finish or a Run got there first). Its error means the
// executor's metadata could not be read; a failure of the assignment itself
// is counted and logged, as in Run, and left to the next Run.
func (r *Recoverer) Finish(ctx context.Context, backend FinishBackend, assignmentID string) (Summary, error) {
	a, found, err := backend.RecoverAssignment(ctx, assignmentID)
	if err != nil {
		return Summary{}, fmt.Errorf("rebuild assignment %s from its executor: %w", assignmentID, err)
	}
	var sum Summary
	if found {
		r.handle(ctx, backend, a, func(f func(*Summary)) { f(&sum) })
	}
	return sum, nil
}

// handle is the step Run and Finish take for each executor: an executor of a
// pool not configured here is left alone; any other goes through
// Worker.Finish, and its payload is deleted once Finish is done.
func (r *Recoverer) handle(ctx context.Context, backend executor.Backend, a taskassignment.Assignment, count func(func(*Summary))) {
	count(func(s *Summary) { s.Executors++ })
	pool, ok := r.Pools[a.Task.Pool]
	if !ok {
		count(func(s *Summary) { s.UnknownPool++ })
		return
	}
	log := r.log().With(slog.String("assignment", a.ID), slog.Int64("task", a.Task.ID))
	w := executor.Worker{Backend: backend, Tasks: pool.Tasks, Bootstrap: r.Bootstrap, Keys: r.Keys, Endings: r.Endings,
		OnEvent: func(e executor.Event) {
			log.Debug(string(e.Name), slog.String("executor", e.Executor), slog.String("phase", string(e.Phase)))
		}}
	done, err := w.Finish(ctx, a)
	switch {
	case err != nil:
		log.Warn("recover could not handle the assignment", slog.Any("error", err))
		count(func(s *Summary) { s.Failed++ })
	case done:
		if err := r.Payloads.Delete(ctx, a.ID); err != nil {
			log.Warn("delete the payload of a finished task", slog.Any("error", err))
		}
		log.Info("assignment finished and cleaned up")
		count(func(s *Summary) { s.Done++ })
	default:
		count(func(s *Summary) { s.Pending++ })
	}
}

// orphans re-publishes payloads with neither a message nor an executor,
// deletes those of tasks Gitea has ended, and fails the tasks whose executor
// took them and vanished.
func (r *Recoverer) orphans(ctx context.Context, withExecutor map[string]bool, sum *Summary) error {
	ids, err := r.Payloads.IDs(ctx)
	if err != nil {
		return fmt.Errorf("list payloads: %w", err)
	}
	queued := map[taskassignment.BackendKind]map[string]bool{}
	var errs []error
	for _, id := range ids {
		if withExecutor[id] {
			continue
		}
		poolName, taskID, err := taskassignment.ParseID(id)
		if err != nil {
			continue
		}
		pool, ok := r.Pools[poolName]
		if !ok {
			continue
		}
		backend, ok := r.Backends[pool.Backend]
		if !ok {
			continue
		}
		if r.Queue != nil {
			if queued[pool.Backend] == nil {
				q, _, err := r.Queue.Queued(ctx, pool.Backend, r.TrustDomain)
				if err != nil {
					errs = append(errs, fmt.Errorf("queued assignments of %s: %w", pool.Backend, err))
					continue
				}
				queued[pool.Backend] = q
			}
			if queued[pool.Backend][id] {
				continue
			}
		} else if due, err := r.graceOver(ctx, id); err != nil {
			errs = append(errs, err)
			continue
		} else if !due {
			continue
		}
		// The listing may be stale: an executor created since is no orphan.
		if e, err := backend.Find(ctx, id); err != nil || e != nil {
			continue
		}
		log := r.log().With(slog.String("assignment", id), slog.Int64("task", taskID))
		terminal, err := pool.Tasks.Terminal(ctx, taskID)
		if err != nil {
			log.Warn("ask Gitea about an orphan payload", slog.Any("error", err))
			continue
		}
		if terminal {
			if err := r.Payloads.Delete(ctx, id); err == nil {
				sum.PayloadsDeleted++
			}
			continue
		}
		// An executor took this task (its runner fetched it) and is gone
		// without a report: expired at its timeout, or deleted by someone
		// else. Sending the assignment again would run the job a second
		// time over what the first run did; it is failed instead.
		started, err := r.Payloads.Started(ctx, id)
		if err != nil {
			log.Warn("ask whether an orphan payload's executor took it", slog.Any("error", err))
			continue
		}
		if started {
			if err := r.failTask(ctx, id, string(pool.Backend), vanishedReason); err != nil {
				errs = append(errs, fmt.Errorf("fail %s, whose executor vanished: %w", id, err))
				continue
			}
			log.Warn("task failed: its executor vanished after it took the task", slog.String("reason", vanishedReason))
			sum.Vanished++
			continue
		}
		a, err := r.rebuild(ctx, pool, id)
		if err != nil {
			log.Error("orphan payload cannot be rebuilt", slog.Any("error", err))
			continue
		}
		if err := r.Sender.Send(ctx, a); err != nil {
			errs = append(errs, fmt.Errorf("re-publish %s: %w", id, err))
			continue
		}
		if r.Queue == nil {
			if err := r.SendMarks.MarkSent(ctx, id); err != nil {
				// Sent, not marked: the next pass after the grace sends it
				// once more, which is harmless.
				log.Warn("mark a re-sent orphan", slog.Any("error", err))
			}
		}
		log.Info("orphan payload re-published")
		sum.Republished++
	}
	return errors.Join(errs...)
}

// vanishedReason is the job log's explanation of a task whose executor took
// it (its runner fetched it: the payload's started mark) and then vanished
// without reporting: an OpenSandbox sandbox removed at its expiry, an
// executor deleted by hand.
const vanishedReason = "its executor vanished (deleted, or removed when its timeout expired) after it took the job and before it reported a result"

// graceOver reports whether the assignment of id was last sent more than
// OrphanGrace ago (the Knative path's orphan rule).
func (r *Recoverer) graceOver(ctx context.Context, id string) (bool, error) {
	if r.SendMarks == nil {
		return false, fmt.Errorf("orphan %s: no queue to read and no send marks: recover cannot tell an orphan", id)
	}
	last, err := r.SendMarks.LastSent(ctx, id)
	if errors.Is(err, taskassignment.ErrPayloadNotFound) {
		return false, nil // deleted since the listing
	}
	if err != nil {
		return false, fmt.Errorf("orphan %s: last sent: %w", id, err)
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	return now().Sub(last) > r.OrphanGrace, nil
}

// rebuild makes the assignment of a stored payload, as dispatch did.
func (r *Recoverer) rebuild(ctx context.Context, pool Pool, id string) (taskassignment.Assignment, error) {
	task, err := r.Payloads.Get(ctx, id)
	if err != nil {
		return taskassignment.Assignment{}, err
	}
	a, err := taskworkflow.FromTask(r.TrustDomain, pool.Backend, pool.Name, task)
	if err != nil {
		return taskassignment.Assignment{}, err
	}
	if a.ID != id {
		return taskassignment.Assignment{}, fmt.Errorf("payload %s holds task %d", id, task.GetId())
	}
	return a, nil
}

// Attrs renders the summary as the attributes of one log line.
func (s Summary) Attrs() []any {
	return []any{slog.Int("executors", s.Executors), slog.Int("done", s.Done), slog.Int("pending", s.Pending),
		slog.Int("failed", s.Failed), slog.Int("unknown_pool", s.UnknownPool),
		slog.Int("republished", s.Republished), slog.Int("payloads_deleted", s.PayloadsDeleted),
		slog.Int("rejected", s.Rejected), slog.Int("exhausted", s.Exhausted), slog.Int("vanished", s.Vanished),
		slog.Int("rejections_dropped", s.RejectionsDropped), slog.Int("rejections_left", s.RejectionsLeft)}
}
