package pull

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// The defaults of Assignments' timings, used where a field is zero.
const (
	// DefaultWait: a KEDA-started run finds its message within a poll.
	DefaultWait = 2 * time.Second
	// DefaultHoldFor: long enough for a Pod to be scheduled on a node that
	// is still starting, short enough that a stuck one does not keep a run.
	DefaultHoldFor = 2 * time.Minute
	// DefaultLingerMax: a lingering run stops fetching 5 minutes after it
	// began, well within the Job's deadline with DefaultHoldFor.
	DefaultLingerMax = 5 * time.Minute
	// minLingerWait is the shortest wait a lingering run fetches with.
	minLingerWait = 50 * time.Millisecond
	// ackTimeout bounds the wait for the server to confirm an ack.
	ackTimeout = 5 * time.Second
)

// Decider is what Assignments needs of handle's core (handler.Handler).
type Decider interface {
	Handle(ctx context.Context, d handler.Delivery) handler.Decision
	ShuttingDown(body []byte) handler.Decision
}

// Assignments is handle's trigger adapter on a JetStream pull consumer: the
// KEDA ScaledJob mode (and local mode's loop). Each run pulls at most Batch
// messages, has the Decider decide each, and settles every one of them by
// its decision before it returns: ack, nak with the decision's delay, hold,
// or terminate with its reason.
//
// A message whose executor waits to be scheduled (NotYet) is held, not
// handed back: the run keeps it in progress and offers it again, soon at
// first and then less often, up to every RetryAfter of its decision (holdDelay), for at most
// HoldFor. While it holds, the message is ack-pending
// and the run is running, so KEDA's default scaling strategy (new Jobs =
// lag - running Jobs, lag = pending + ack-pending) starts no Job for it: an
// assignment that waits for its executor costs one running handle, not one
// new handle per polling interval. A run that holds fetches nothing more:
// under KEDA other Jobs take the rest; a caller that runs Assignments in a loop
// (local mode) fetches again once every held message is settled.
//
// A lingering run (Linger > 0) is a warm handle: once its batch is settled
// it fetches again, so the next assignment is handled within a fetch, not
// after KEDA's poll and a new Job's start. It ends when a wait brings no
// message, after Linger idle, or once LingerMax has passed since it began.
// KEDA's arithmetic still holds: a lingering run is a running Job, so a
// message that arrives while it waits raises the lag by one and starts no
// Job (lag - running = 0) while the run takes it; a run that holds fetches
// nothing more, and a second message then starts a Job of its own.
type Assignments struct {
	Decider  Decider
	Consumer Puller
	Log      *slog.Logger
	// Batch is the most messages one run takes (at least 1).
	Batch int
	// Wait is how long a run waits for its first message (zero:
	// DefaultWait).
	Wait time.Duration
	// HoldFor bounds how long a run holds a NotYet message, from its first
	// NotYet: no offer is made later than that, the message is naked with
	// the decision's RetryAfter instead (zero: DefaultHoldFor; shorter
	// than RetryAfter: never held). The longest wait between offers is
	// the decision's RetryAfter, which must stay well below the
	// consumer's AckWait: a held message is kept in progress once per
	// offer.
	HoldFor time.Duration
	// MaxDeliver is the consumer's MaxDeliver (zero:
	// taskassignment.MaxDeliver, what OpenConsumer sets). A message handed
	// back on its last delivery is terminated, not naked (see nak), with a
	// reason naming its assignment (taskassignment.ExhaustedReason), for
	// recover to fail the task with. With the backoff cap that is days
	// away, longer than a payload lives, so in practice the job's own
	// deadline ends such a task first; the rule guarantees that no message
	// is ever left undeliverable in the stream.
	MaxDeliver int
	// Linger, when positive, makes the run fetch again once a batch is
	// settled, waiting up to Linger for its next message (the server ends
	// a pull request at 90% of its wait, so idle for 0.9 Linger); it ends at
	// the first wait that brings none. Zero: one batch, then the run ends.
	Linger time.Duration
	// LingerMax bounds a lingering run: no fetch begins, and none waits,
	// past LingerMax after the run began (zero: DefaultLingerMax). The
	// run's lifetime is then at most LingerMax + HoldFor + its backend
	// calls, which the Job's activeDeadlineSeconds must exceed.
	LingerMax time.Duration
}

// Summary counts what one run of Assignments did with the messages it fetched.
type Summary struct {
	Fetched, Accepted, NotYet, Failed, Poison, Rejected int
}

func (s *Summary) count(o handler.Outcome) {
	switch o {
	case handler.Accepted:
		s.Accepted++
	case handler.NotYet:
		s.NotYet++
	case handler.Failed:
		s.Failed++
	case handler.Poison:
		s.Poison++
	case handler.Rejected:
		s.Rejected++
	}
}

// Run fetches and settles one batch, and when it lingers (see Assignments) the
// batches after it. Every message it fetched is settled before it returns:
// acknowledged (Accepted), naked with a delay (NotYet, Failed) or terminated
// (Poison, Rejected). A NotYet message is first held (see Assignments) and counts as
// NotYet only when the run gives it up. When ctx is cancelled
// (SIGTERM), the message in flight, those held and those not yet started are
// naked at once, so another handler takes them without waiting for AckWait.
//
// Crash window: a run killed while it holds a message (SIGKILL, a lost
// node) settles nothing; the message comes back AckWait after its last
// in-progress signal, to a run whose Accept finds the executor it created.
//
// An ack is confirmed by the server before Run counts the message Accepted;
// naks and terminations are published on the consumer's connection without
// a reply: flush it before the process exits. The error is only for a
// fetch that failed; outcomes of single messages are in the Summary and the
// log. No message available is a successful, empty run.
func (j Assignments) Run(ctx context.Context) (Summary, error) {
	var sum Summary
	batch := max(j.Batch, 1)
	wait := cmp.Or(j.Wait, DefaultWait)
	end := time.Now().Add(cmp.Or(j.LingerMax, DefaultLingerMax))
	for ctx.Err() == nil {
		fetched := sum.Fetched
		if err := j.fetch(ctx, batch, wait, &sum); err != nil {
			return sum, err
		}
		// A wait too short to be worth a pull request (or already past
		// when the fetch computes its expiry) ends the run too.
		wait = min(j.Linger, time.Until(end))
		if sum.Fetched == fetched || wait < minLingerWait {
			break
		}
	}
	return sum, nil
}

// fetch fetches at most batch messages, waiting at most wait, and settles
// each (settleAll) before it returns. The error is only for a fetch that
// failed.
func (j Assignments) fetch(ctx context.Context, batch int, wait time.Duration, sum *Summary) error {
	fetchCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	msgs, err := j.Consumer.Fetch(batch, jetstream.FetchContext(fetchCtx))
	if err != nil {
		return fmt.Errorf("fetch from consumer: %w", err)
	}
	j.settleAll(ctx, msgs.Messages(), sum)
	if err := msgs.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, jetstream.ErrNoMessages) {
		return fmt.Errorf("fetch from consumer: %w", err)
	}
	return nil
}

// held is a message the run holds: offered again at next, never after
// deadline (zero until its first NotYet).
type held struct {
	msg      jetstream.Msg
	next     time.Time
	deadline time.Time
	offers   int // NotYet answers so far
}

// settleAll settles every message of in as it arrives and offers each held
// one again when it is due, until in is closed, nothing is held and every
// ack is confirmed. Held messages wait side by side: one that waits delays
// neither the rest of the batch nor another held one (offers are made one at
// a time, so a slow Accept delays the next due offer by its own duration).
// Acks are confirmed side by side too: the next message is offered while the
// server's answer to the last ack is on its way, and a message counts
// Accepted once its answer came (see settle). When ctx ends, everything held
// is handed back at once.
func (j Assignments) settleAll(ctx context.Context, in <-chan jetstream.Msg, sum *Summary) {
	var holds []*held
	confirmed := make(chan handler.Outcome) // one per ack under way (confirming)
	confirming := 0
	timer := time.NewTimer(time.Hour) // reset to the first due offer below
	defer timer.Stop()
	stop := ctx.Done()
	for in != nil || len(holds) > 0 || confirming > 0 {
		var due <-chan time.Time
		first := 0
		if len(holds) > 0 {
			for i, h := range holds {
				if h.next.Before(holds[first].next) {
					first = i
				}
			}
			timer.Reset(time.Until(holds[first].next))
			due = timer.C
		}
		var offer []*held
		select {
		case o := <-confirmed:
			confirming--
			sum.count(o)
			continue
		case msg, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			sum.Fetched++
			offer = []*held{{msg: msg}}
		case <-due:
			offer = []*held{holds[first]}
			holds = append(holds[:first], holds[first+1:]...)
		case <-stop:
			stop = nil
			offer, holds = holds, nil
		}
		for _, h := range offer {
			switch o, f := j.settle(ctx, h, confirmed); f {
			case kept:
				holds = append(holds, h)
			case confirmingAck:
				confirming++
			default:
				sum.count(o)
			}
		}
	}
}

// fate is what settle did with a message.
type fate int

const (
	// settled: acked, naked or terminated; count its outcome now.
	settled fate = iota
	// kept: NotYet and still held; offer it again when due.
	kept
	// confirmingAck: accepted and acked, the server's confirmation under
	// way; its outcome arrives on settle's channel.
	confirmingAck
)

// settle has h's message decided and settles it by the decision, or keeps
// it when it is NotYet and may still be held. An accepted message is acked
// with the server's confirmation awaited in the background (confirmingAck):
// its outcome, Accepted once confirmed, else Failed, is sent on confirmed.
func (j Assignments) settle(ctx context.Context, h *held, confirmed chan<- handler.Outcome) (handler.Outcome, fate) {
	log := j.log()
	msg := h.msg
	attrs := []any{slog.String("subject", msg.Subject())}
	if md, err := msg.Metadata(); err == nil {
		attrs = append(attrs, slog.Uint64("stream_seq", md.Sequence.Stream), slog.Uint64("delivered", md.NumDelivered))
	}
	if ctx.Err() != nil {
		// Decided unoffered: on its last delivery the message is
		// terminated with a reason naming the assignment.
		d := j.Decider.ShuttingDown(msg.Data())
		j.nak(log, msg, 0, d.Assignment.ID, attrs)
		log.Info("assignment handed back", append(attrs, slog.Any("reason", d.Err))...)
		return handler.Failed, settled
	}
	d := j.Decider.Handle(ctx, handler.Delivery{Body: msg.Data(), Count: Count(msg)})
	if d.Assignment.ID != "" {
		attrs = append(attrs, slog.String("assignment", d.Assignment.ID), slog.Int64("task", d.Assignment.Task.ID))
	}
	switch d.Outcome {
	case handler.Accepted:
		// A confirmed ack: once the server has answered, the message is gone
		// from the stream, so "accepted" in the log is a fact. It is sent
		// even when ctx has ended (the executor exists: handing the message
		// back would only cost a redelivery). An ack that is not confirmed
		// (NATS restarting) costs a redelivery after AckWait, which Accept
		// answers by finding the executor, or its task's end mark, never by
		// creating a second one. The answer is awaited here, in the
		// background, so that the round trip does not hold up the next
		// message; Run returns only once it came.
		go func() {
			ackCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
			err := msg.DoubleAck(ackCtx)
			cancel()
			if err != nil {
				log.Warn("assignment accepted, acknowledgement not confirmed", append(attrs, slog.Any("error", err))...)
				confirmed <- handler.Failed
				return
			}
			log.Info("assignment accepted", attrs...)
			confirmed <- handler.Accepted
		}()
		return handler.Accepted, confirmingAck
	case handler.NotYet:
		// A decider that names no delay gets the core's default: a hold
		// re-offering at once would ask the backend in a loop.
		delay := cmp.Or(max(d.RetryAfter, 0), handler.DefaultNotYetDelay)
		starts := h.deadline.IsZero()
		if j.hold(ctx, h, delay, holdDelay(h.offers, delay)) {
			h.offers++
			if starts {
				log.Info("assignment held while it waits for its identity target", append(attrs, slog.Duration("retry_in", delay), slog.Time("until", h.deadline))...)
			}
			if err := msg.InProgress(); err != nil {
				// Held on: the message may come back to another run after
				// AckWait, whose Accept finds this very executor.
				log.Warn("assignment held, in-progress signal not sent", append(attrs, slog.Any("error", err))...)
			}
			return handler.NotYet, kept
		}
		if ctx.Err() != nil {
			delay = 0
		}
		j.nak(log, msg, delay, d.Assignment.ID, attrs)
		log.Info("assignment waits for its identity target", append(attrs, slog.Duration("retry_in", delay))...)
	case handler.Failed:
		delay := d.RetryAfter
		if ctx.Err() != nil {
			delay = 0
		}
		j.nak(log, msg, delay, d.Assignment.ID, attrs)
		log.Warn("assignment not accepted", append(attrs, slog.Duration("retry_in", delay), slog.Any("error", d.Err))...)
	case handler.Poison:
		if terr := msg.TermWithReason(d.Reason); terr != nil {
			log.Error("terminate "+d.Reason, append(attrs, slog.Any("error", terr))...)
		}
		log.Error(d.Reason+" terminated", append(attrs, slog.Any("error", d.Err))...)
	case handler.Rejected:
		// The reason goes into the server's termination advisory, which the
		// rejection stream keeps until recover has failed the task with it.
		// A term lost on its way costs a redelivery after AckWait, which is
		// rejected again.
		if terr := msg.TermWithReason(d.Reason); terr != nil {
			log.Error("terminate a rejected assignment", append(attrs, slog.Any("error", terr))...)
		}
		log.Error("assignment rejected: it can never be accepted; terminated, for recover to fail the task", append(attrs, slog.Any("error", d.Err))...)
	}
	return d.Outcome, settled
}

// hold schedules h's next offer delay from now and reports true, or reports
// false when that offer would come after h's deadline or ctx has ended.
// The first NotYet of h starts its deadline, HoldFor from now. Holding is
// off when HoldFor is shorter than retryAfter, the decision's delay.
func (j Assignments) hold(ctx context.Context, h *held, retryAfter, delay time.Duration) bool {
	holdFor := cmp.Or(j.HoldFor, DefaultHoldFor)
	if holdFor < retryAfter {
		return false // holding is off (see HoldFor)
	}
	now := time.Now()
	if h.deadline.IsZero() {
		h.deadline = now.Add(holdFor)
	}
	next := now.Add(delay)
	if ctx.Err() != nil || next.After(h.deadline) {
		return false
	}
	h.next = next
	return true
}

// holdDelay is when a message held after offers NotYet answers is offered
// again: every holdStep for the first holdSteps answers (a Pod is usually
// scheduled within a second or two, and the executor's start waits for the
// offer that binds its identity), then doubling from 2 holdStep up to max
// (the decision's RetryAfter). An offer costs the backend one lookup.
func holdDelay(offers int, max time.Duration) time.Duration {
	d := holdStep
	for i := holdSteps; i <= offers && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// holdStep and holdSteps: see holdDelay.
const (
	holdStep  = 250 * time.Millisecond
	holdSteps = 8
)

func (j Assignments) log() *slog.Logger {
	if j.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return j.Log
}

// nak hands msg back, to come again after delay. On its last delivery
// (MaxDeliver) it is terminated instead, whatever the reason it goes back
// (failed, still waiting, shutdown): a message naked then would stay in the
// stream undelivered and counted as queued for ever. The termination's
// reason names the assignment (taskassignment.ExhaustedReason(id)), and
// recover fails the task with it; without an ID (a message that does not
// decode) its payload is an orphan that recover re-publishes.
func (j Assignments) nak(log *slog.Logger, msg jetstream.Msg, delay time.Duration, assignmentID string, attrs []any) {
	terminated, err := Retry(msg, delay, cmp.Or(j.MaxDeliver, taskassignment.MaxDeliver), taskassignment.ExhaustedReason(assignmentID))
	switch {
	case terminated:
		if err != nil {
			log.Error("terminate an assignment on its last delivery", append(attrs, slog.Any("error", err))...)
		}
		log.Error("assignment handed back on its last delivery: terminated, for recover to fail the task", attrs...)
	case err != nil:
		log.Warn("nak failed; the message returns after its ack wait", append(attrs, slog.Any("error", err))...)
	}
}
