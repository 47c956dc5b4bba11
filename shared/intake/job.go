package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
)

// Puller is the part of a jetstream.Consumer that Job uses.
type Puller interface {
	Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error)
}

// The defaults of Job's timings, used where a field is zero.
const (
	// DefaultWait: a KEDA-started run finds its message within a poll.
	DefaultWait = 2 * time.Second
	// DefaultNakDelay: a Pod is usually scheduled within seconds.
	DefaultNakDelay = 5 * time.Second
	// DefaultErrorDelay: a failed backend call is not retried at once.
	DefaultErrorDelay = 15 * time.Second
)

// orDefault is d, or def when d is zero.
func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Job is the KEDA ScaledJob mode: each run pulls at most Batch messages and
// settles every one of them before it returns.
type Job struct {
	Handler  Handler
	Consumer Puller
	// Batch is the most messages one run takes (at least 1).
	Batch int
	// Wait is how long a run waits for its first message (zero:
	// DefaultWait).
	Wait time.Duration
	// NakDelay is when a NotYet message comes back (zero: DefaultNakDelay).
	NakDelay time.Duration
	// ErrorDelay is when a Failed message comes back (zero:
	// DefaultErrorDelay).
	ErrorDelay time.Duration
}

// Summary counts what one run did with the messages it fetched.
type Summary struct {
	Fetched, Accepted, NotYet, Failed, Poison int
}

func (s *Summary) count(o Outcome) {
	switch o {
	case Accepted:
		s.Accepted++
	case NotYet:
		s.NotYet++
	case Failed:
		s.Failed++
	case Poison:
		s.Poison++
	}
}

// Run fetches and settles one batch. Every message it fetched is settled
// before it returns: acknowledged (Accepted), naked
// with a delay (NotYet, Failed) or terminated (Poison). When ctx is cancelled
// (SIGTERM), the message in flight and those not yet started are naked at
// once, so another handler takes them without waiting for AckWait.
//
// Settling publishes on the consumer's connection: flush it before the
// process exits. The error is only for a run that could not fetch at all; outcomes of single
// messages are in the Summary and the log. No message available is a
// successful, empty run.
func (j Job) Run(ctx context.Context) (Summary, error) {
	var sum Summary
	if ctx.Err() != nil {
		return sum, nil
	}
	batch := max(j.Batch, 1)
	fetchCtx, cancel := context.WithTimeout(ctx, orDefault(j.Wait, DefaultWait))
	defer cancel()
	msgs, err := j.Consumer.Fetch(batch, jetstream.FetchContext(fetchCtx))
	if err != nil {
		return sum, fmt.Errorf("fetch from consumer: %w", err)
	}
	for msg := range msgs.Messages() {
		sum.Fetched++
		sum.count(j.settle(ctx, msg))
	}
	if err := msgs.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, jetstream.ErrNoMessages) {
		return sum, fmt.Errorf("fetch from consumer: %w", err)
	}
	return sum, nil
}

func (j Job) settle(ctx context.Context, msg jetstream.Msg) Outcome {
	log := j.Handler.log()
	attrs := []any{slog.String("subject", msg.Subject())}
	if md, err := msg.Metadata(); err == nil {
		attrs = append(attrs, slog.Uint64("stream_seq", md.Sequence.Stream), slog.Uint64("delivered", md.NumDelivered))
	}
	if ctx.Err() != nil {
		j.nak(log, msg, 0, attrs)
		log.Info("assignment handed back", append(attrs, slog.String("reason", errShutdown.Error()))...)
		return Failed
	}
	a, outcome, err := j.Handler.Handle(ctx, msg.Data())
	if a.ID != "" {
		attrs = append(attrs, slog.String("assignment", a.ID), slog.Int64("task", a.Task.ID))
	}
	switch outcome {
	case Accepted:
		// A plain ack: the caller flushes its connection before it exits. An
		// ack lost on the way costs a redelivery after AckWait, which Accept
		// answers by finding the executor, never a second one.
		if err := msg.Ack(); err != nil {
			log.Warn("assignment accepted, acknowledgement not sent", append(attrs, slog.Any("error", err))...)
			return Failed
		}
		log.Info("assignment accepted", attrs...)
	case NotYet:
		delay := orDefault(j.NakDelay, DefaultNakDelay)
		j.nak(log, msg, delay, attrs)
		log.Info("assignment waits for its identity target", append(attrs, slog.Duration("retry_in", delay))...)
	case Failed:
		delay := orDefault(j.ErrorDelay, DefaultErrorDelay)
		if ctx.Err() != nil {
			delay = 0
		}
		j.nak(log, msg, delay, attrs)
		log.Warn("assignment not accepted", append(attrs, slog.Duration("retry_in", delay), slog.Any("error", err))...)
	case Poison:
		reason := "malformed assignment"
		if errors.Is(err, assignmentsig.ErrUnauthenticated) {
			reason = "unauthenticated assignment"
		}
		if terr := msg.TermWithReason(reason); terr != nil {
			log.Error("terminate "+reason, append(attrs, slog.Any("error", terr))...)
		}
		log.Error(reason+" terminated", append(attrs, slog.Any("error", err))...)
	}
	return outcome
}

func (j Job) nak(log *slog.Logger, msg jetstream.Msg, delay time.Duration, attrs []any) {
	var err error
	if delay > 0 {
		err = msg.NakWithDelay(delay)
	} else {
		err = msg.Nak()
	}
	if err != nil {
		log.Warn("nak failed; the message returns after its ack wait", append(attrs, slog.Any("error", err))...)
	}
}
