package recoverer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/delivery"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// The defaults of Notices' timings, used where a field is zero.
const (
	// DefaultNoticeWait: a KEDA-started run finds its notice within a poll.
	DefaultNoticeWait = 2 * time.Second
	// DefaultNoticeRetry: a runner that has reported its result exits at
	// once; its executor's phase follows within a second or two (the
	// kubelet's status update). With FinishedMaxDeliver it covers about 8 s.
	DefaultNoticeRetry = 2 * time.Second
)

// Notices is recover's finish mode for one backend: each run pulls at most
// Batch finish notices (assignmentqueue.Finished) and runs Finish for each,
// so that an executor whose runner reported its final result is reported,
// deleted and its payload deleted (its slot freed) within seconds, not on the
// next periodic pass.
//
// A notice is unauthenticated: all it does is make Finish look at one
// executor now. Finish acts only on what it reads from Gitea and the backend,
// and never creates an executor, so a forged or early notice changes nothing,
// and a run may go side by side with the periodic pass (see the package doc).
type Notices struct {
	Recoverer *Recoverer
	Backend   taskassignment.BackendKind
	// Executors is the backend's executors, found one at a time.
	Executors FinishBackend
	Consumer  delivery.Puller
	// Batch is the most notices one run takes (at least 1).
	Batch int
	// Wait is how long a run waits for its first notice (zero:
	// DefaultNoticeWait).
	Wait time.Duration
	// Retry is when a notice whose executor has not ended yet comes back,
	// from the Finish that found it running (zero: DefaultNoticeRetry).
	Retry time.Duration
	// MaxDeliver is the consumer's MaxDeliver (zero:
	// taskassignment.FinishedMaxDeliver). A notice handed back on its last
	// delivery is terminated: its executor is left to the periodic pass.
	MaxDeliver int
}

// NoticeSummary counts what one run did with the notices it fetched.
type NoticeSummary struct {
	Fetched int
	// Finished: the executor was reported (or Gitea had ended the task) and
	// deleted, and its payload deleted. Absent: no executor, nothing to do.
	Finished, Absent int
	// Retried: the executor has not ended yet, or Finish failed; the notice
	// comes back after Retry. Dropped: the same on its last delivery, or a
	// notice that names no assignment of a pool of this backend.
	Retried, Dropped int
}

// Run fetches and settles one batch. Every notice it fetched is settled
// before it returns: acknowledged (finished, or no executor), naked with
// Retry (not ended yet, or a failure) or terminated (last delivery, malformed,
// another backend's). Naks are sent once the fetch has ended, so that a notice
// never comes back into the run that handed it back. When ctx ends (SIGTERM),
// the fetch still runs to its end (at most Wait: a cancelled fetch would drop
// notices already delivered to it, stranding them for the ack wait), no
// further Finish starts, and every notice not finished is naked without
// delay for another run. The error is only for a run that could not fetch at
// all.
//
// Crash window: a run killed between Finish and its ack settles nothing; the
// notice comes back after the consumer's AckWait to a Finish that finds no
// executor and acknowledges it. A run killed before Finish loses nothing
// either. Acknowledgements are published on the consumer's connection: flush
// it before the process exits.
func (n Notices) Run(ctx context.Context) (NoticeSummary, error) {
	var sum NoticeSummary
	if ctx.Err() != nil {
		return sum, nil
	}
	if n.Recoverer == nil || n.Executors == nil || n.Consumer == nil {
		return sum, errors.New("recoverer: notices need a recovery, a backend and a consumer")
	}
	msgs, err := n.Consumer.Fetch(max(n.Batch, 1), jetstream.FetchMaxWait(cmp.Or(n.Wait, DefaultNoticeWait)))
	if err != nil {
		return sum, fmt.Errorf("fetch finish notices of %s: %w", n.Backend, err)
	}
	var back []retry
	for msg := range msgs.Messages() {
		sum.Fetched++
		if r, again := n.settle(ctx, msg, &sum); again {
			back = append(back, r)
		}
	}
	for _, r := range back {
		// Retry counts from the Finish that found the executor running, not
		// from the end of the fetch.
		delay := max(cmp.Or(n.Retry, DefaultNoticeRetry)-time.Since(r.at), 0)
		if ctx.Err() != nil {
			delay = 0
		}
		n.nak(r.log, r.msg, delay, &sum)
	}
	if err := msgs.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
		return sum, fmt.Errorf("fetch finish notices of %s: %w", n.Backend, err)
	}
	return sum, nil
}

// retry is a notice to hand back once the fetch has ended.
type retry struct {
	msg jetstream.Msg
	log *slog.Logger
	at  time.Time // when it was found not finished
}

// settle runs Finish for one notice and settles it by the outcome, except
// a notice to hand back (again): that is the caller's, after the fetch.
func (n Notices) settle(ctx context.Context, msg jetstream.Msg, sum *NoticeSummary) (r retry, again bool) {
	log := n.Recoverer.log().With(slog.String("backend", string(n.Backend)))
	id, err := taskassignment.FinishedNotice(msg.Data())
	if err != nil {
		n.term(log, msg, "malformed finish notice", err)
		sum.Dropped++
		return retry{}, false
	}
	log = log.With(slog.String("assignment", id))
	if pool, _, _ := taskassignment.ParseID(id); n.Recoverer.Pools[pool].Backend != n.Backend {
		n.term(log, msg, "finish notice of no pool of this backend", fmt.Errorf("pool %q", pool))
		sum.Dropped++
		return retry{}, false
	}
	if ctx.Err() != nil {
		log.Info("finish notice handed back", slog.String("reason", "shutting down"))
		return retry{msg, log, time.Now()}, true
	}
	fs, err := n.Recoverer.Finish(ctx, n.Executors, id)
	switch {
	case err == nil && fs.Executors == 0:
		// Another Finish or a pass got there first, or the notice is early
		// for an executor not created yet (Accept creates it; its end comes
		// with a notice of its own, or the pass).
		n.ack(log, msg)
		sum.Absent++
		log.Info("finish notice: no executor, nothing to do")
		return retry{}, false
	case err == nil && fs.Done > 0:
		n.ack(log, msg)
		sum.Finished++
		log.Info("finish notice: executor finished and cleaned up")
		return retry{}, false
	default:
		// Not ended yet (the runner is still exiting), or Finish failed.
		log.Info("finish notice: executor not ended yet, or not finished; handed back", slog.Any("error", err))
		return retry{msg, log, time.Now()}, true
	}
}

// nak hands msg back to come again after delay, or terminates it on its last
// delivery (a work-queue message naked then would stay in the stream for
// ever).
func (n Notices) nak(log *slog.Logger, msg jetstream.Msg, delay time.Duration, sum *NoticeSummary) {
	const exhausted = "deliveries exhausted: left to recover's periodic pass"
	terminated, err := delivery.Retry(msg, delay, cmp.Or(n.MaxDeliver, taskassignment.FinishedMaxDeliver), exhausted)
	switch {
	case terminated:
		n.termed(log, exhausted, nil, err)
		sum.Dropped++
		return
	case err != nil:
		log.Warn("finish notice nak failed; it returns after its ack wait", slog.Any("error", err))
	}
	sum.Retried++
}

func (n Notices) ack(log *slog.Logger, msg jetstream.Msg) {
	if err := msg.Ack(); err != nil {
		// Delivered again after the ack wait: Finish then finds nothing.
		log.Warn("finish notice settled, acknowledgement not sent", slog.Any("error", err))
	}
}

func (n Notices) term(log *slog.Logger, msg jetstream.Msg, reason string, cause error) {
	n.termed(log, reason, cause, msg.TermWithReason(reason))
}

// termed logs a notice's termination for reason (because of cause), or
// that it failed (err).
func (n Notices) termed(log *slog.Logger, reason string, cause, err error) {
	if err != nil {
		log.Warn("terminate finish notice", slog.String("reason", reason), slog.Any("error", err))
		return
	}
	log.Warn("finish notice dropped", slog.String("reason", reason), slog.Any("error", cause))
}

// Listed returns b as a FinishBackend: b itself when it rebuilds the
// assignment of one executor (RecoverAssignment), else an adapter that lists
// every executor of b (RecoverAssignments) and picks the one asked for; that
// costs one list per notice (for the pod backend, one label-selected list of
// the namespace's executor Pods).
func Listed(b Backend) FinishBackend {
	if f, ok := b.(FinishBackend); ok {
		return f
	}
	return listed{b}
}

type listed struct{ Backend }

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
