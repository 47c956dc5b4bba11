package pull

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// DefaultNoticeWait is Notices' Wait where it is zero: a KEDA-started run
// finds its notice within a poll.
const DefaultNoticeWait = 2 * time.Second

// NoticeDecider is what Notices needs of recover's core
// (recoverer.NoticeHandler).
type NoticeDecider interface {
	Handle(ctx context.Context, body []byte) taskassignment.NoticeDecision
}

// Notices is recover's trigger adapter for the finish notices of one backend
// (recover's finish mode, a KEDA ScaledJob): each run pulls at most Batch
// notices, has the Decider decide each, and settles it by the decision.
type Notices struct {
	Decider NoticeDecider
	// Backend names the notices' backend, in errors and the log.
	Backend  taskassignment.BackendKind
	Consumer Puller
	Log      *slog.Logger
	// Batch is the most notices one run takes (at least 1).
	Batch int
	// Wait is how long a run waits for its first notice (zero:
	// DefaultNoticeWait).
	Wait time.Duration
	// MaxDeliver is the consumer's MaxDeliver (zero:
	// taskassignment.FinishedMaxDeliver). A notice handed back on its last
	// delivery is terminated: its executor is left to the periodic pass.
	MaxDeliver int
}

// NoticeSummary counts what one run of Notices did with the notices it
// fetched.
type NoticeSummary struct {
	Fetched int
	// Finished: the executor was reported (or Gitea had ended the task) and
	// deleted, and its payload deleted. Absent: no executor, nothing to do.
	Finished, Absent int
	// Retried: the executor has not ended yet, or Finish failed; the notice
	// comes back after its decision's delay. Dropped: the same on its last
	// delivery, or a notice that names no assignment of a pool of this
	// backend.
	Retried, Dropped int
}

// Run fetches and settles one batch. Every notice it fetched is settled
// before it returns: acknowledged (finished, or no executor), naked with its
// decision's delay (not ended yet, or a failure) or terminated (last
// delivery, malformed, another backend's). Naks are sent once the fetch has
// ended, so that a notice never comes back into the run that handed it back.
// When ctx ends (SIGTERM), the fetch still runs to its end (at most Wait: a
// cancelled fetch would drop notices already delivered to it, stranding them
// for the ack wait), the decider starts no further Finish, and every notice
// not finished is naked without delay for another run. The error is only
// for a run that could not fetch at all.
//
// Crash window: a run killed between a decision and its ack settles nothing;
// the notice comes back after the consumer's AckWait (see
// recoverer.NoticeHandler.Handle). Acknowledgements are published on the
// consumer's connection: flush it before the process exits.
func (n Notices) Run(ctx context.Context) (NoticeSummary, error) {
	var sum NoticeSummary
	if ctx.Err() != nil {
		return sum, nil
	}
	if n.Decider == nil || n.Consumer == nil {
		return sum, errors.New("notices need a decider and a consumer")
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
		// The delay counts from the decision, not from the end of the
		// fetch.
		delay := max(r.after-time.Since(r.at), 0)
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
	msg   jetstream.Msg
	log   *slog.Logger
	at    time.Time     // when it was decided
	after time.Duration // the decision's RetryAfter
}

// settle has one notice decided and settles it by the decision, except a
// notice to hand back (again): that is the caller's, after the fetch.
func (n Notices) settle(ctx context.Context, msg jetstream.Msg, sum *NoticeSummary) (r retry, again bool) {
	log := n.log().With(slog.String("backend", string(n.Backend)))
	d := n.Decider.Handle(ctx, msg.Data())
	if d.Assignment != "" {
		log = log.With(slog.String("assignment", d.Assignment))
	}
	switch d.Outcome {
	case taskassignment.NoticeDropped:
		n.termed(log, d.Reason, d.Err, msg.TermWithReason(d.Reason))
		sum.Dropped++
	case taskassignment.NoticeAbsent:
		n.ack(log, msg)
		sum.Absent++
		log.Info("finish notice: no executor, nothing to do")
	case taskassignment.NoticeFinished:
		n.ack(log, msg)
		sum.Finished++
		log.Info("finish notice: executor finished and cleaned up")
	default:
		log.Info("finish notice handed back: executor not ended yet, not finished, or shutting down", slog.Any("error", d.Err))
		return retry{msg: msg, log: log, at: time.Now(), after: d.RetryAfter}, true
	}
	return retry{}, false
}

// nak hands msg back to come again after delay, or terminates it on its last
// delivery (a work-queue message naked then would stay in the stream for
// ever).
func (n Notices) nak(log *slog.Logger, msg jetstream.Msg, delay time.Duration, sum *NoticeSummary) {
	const exhausted = "deliveries exhausted: left to recover's periodic pass"
	terminated, err := Retry(msg, delay, cmp.Or(n.MaxDeliver, taskassignment.FinishedMaxDeliver), exhausted)
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

// termed logs a notice's termination for reason (because of cause), or
// that it failed (err).
func (n Notices) termed(log *slog.Logger, reason string, cause, err error) {
	if err != nil {
		log.Warn("terminate finish notice", slog.String("reason", reason), slog.Any("error", err))
		return
	}
	log.Warn("finish notice dropped", slog.String("reason", reason), slog.Any("error", cause))
}

func (n Notices) log() *slog.Logger {
	if n.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return n.Log
}
