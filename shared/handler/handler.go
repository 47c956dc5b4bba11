// Package handler decides what becomes of an assignment message: it is the
// core of the `handle` function. It sees no queue: its trigger adapters
// deliver the messages and carry its Decision out (shared/trigger/pull for
// the KEDA job mode and local mode: pull a few messages, settle them, exit;
// shared/trigger/push for the Knative mode: one CloudEvent per HTTP request).
//
// Every adapter gets the same decision per message (see Outcome): acknowledge
// once the backend holds every recovery fact, offer it again after
// RetryAfter when that is not yet so or something transient failed, and
// drop with a Reason a message that can never decode (Poison) or whose
// assignment can never be accepted (Rejected: the backend said so with
// executor.Permanent).
package handler

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// The defaults of Handler's delays, used where a field is zero.
const (
	// DefaultNotYetDelay: a Pod is usually scheduled within seconds.
	DefaultNotYetDelay = 5 * time.Second
	// DefaultErrorDelay: a failed backend call is not retried at once.
	DefaultErrorDelay = 15 * time.Second
	// MaxErrorDelay caps the backoff of a message that keeps failing.
	MaxErrorDelay = 5 * time.Minute
)

// ErrorBackoff is when a message that failed on its delivered-th delivery
// comes back: base, doubled with every delivery, at most MaxErrorDelay. A
// backend that is down for an hour costs a few dozen deliveries, not
// hundreds, and a blip still costs only base.
func ErrorBackoff(base time.Duration, delivered uint64) time.Duration {
	d := base
	for i := uint64(1); i < delivered && d < MaxErrorDelay; i++ {
		d *= 2
	}
	return min(d, MaxErrorDelay)
}

// Acceptor is what the handler needs of an executor.Worker.
type Acceptor interface {
	Accept(ctx context.Context, a taskassignment.Assignment) (bool, error)
}

// Outcome is the fate of one message.
type Outcome int

const (
	// Accepted: the backend holds the executor and its identity; acknowledge.
	Accepted Outcome = iota
	// NotYet: the executor exists but its identity target is pending;
	// redeliver after a delay.
	NotYet
	// Failed: a transient error (backend, network, shutdown); redeliver
	// after a backoff.
	Failed
	// Poison: the message is not authentic or can never decode; terminate
	// it.
	Poison
	// Rejected: the assignment is authentic but can never be accepted (the
	// backend's error is executor.Permanent: an invalid spec, a pool it
	// has no profile for, a runner that cannot start). Terminate it with a
	// reason naming the assignment (taskassignment.RejectedReason), which
	// recover turns into a failed task with that reason in its log.
	Rejected
)

func (o Outcome) String() string {
	switch o {
	case Accepted:
		return "accepted"
	case NotYet:
		return "not_yet"
	case Failed:
		return "failed"
	case Poison:
		return "poison"
	case Rejected:
		return "rejected"
	}
	return "unknown"
}

// Opener authenticates a message and returns the bytes that were signed
// (assignmentsig.Keyring). It holds public keys only.
type Opener interface {
	Open(sealed []byte) ([]byte, error)
}

// errNoKeys is the transient failure of a Handler without keys.
var errNoKeys = errors.New("handler: no keys to authenticate assignments with")

// Delivery is one message as an adapter received it.
type Delivery struct {
	// Body is the message as it came: a signed assignment, or not.
	Body []byte
	// Count is how often the message has been delivered, this time
	// included: 1 the first time, 0 when the transport does not say.
	Count uint64
}

// Decision is what becomes of one message, for its adapter to carry out
// (as controller-runtime's reconcile.Result is for its controller).
type Decision struct {
	// Assignment is the message's, once authenticated and decoded; zero
	// when it did not decode.
	Assignment taskassignment.Assignment
	Outcome    Outcome
	// RetryAfter is when to offer the message again: NotYet and Failed
	// only. For NotYet it is also the longest wait between the offers of
	// an adapter that holds the message meanwhile.
	RetryAfter time.Duration
	// Reason says why a Poison or Rejected message is dropped, in the
	// form its adapter records it with (Rejected:
	// taskassignment.RejectedReason, which recover fails the task with).
	// It never carries a credential.
	Reason string
	// Err is why the outcome is Failed, Poison or Rejected.
	Err error
}

// Handler decides the fate of assignment messages.
type Handler struct {
	Worker      Acceptor
	TrustDomain spiffeid.TrustDomain
	// Keys authenticates every message before any byte of it is trusted. A
	// Handler without Keys accepts nothing (and loses nothing: Failed).
	Keys Opener
	// Observer, when set, hears the outcome of every Handle.
	Observer Observer
	// NotYetDelay is when a NotYet message is offered again (zero:
	// DefaultNotYetDelay).
	NotYetDelay time.Duration
	// ErrorDelay is when a Failed message first comes back, doubled with
	// every delivery (ErrorBackoff; zero: DefaultErrorDelay).
	ErrorDelay time.Duration
}

// Observer hears the outcome of every message handled (metrics): once per
// offer, so an assignment offered again while its identity target is
// pending counts NotYet each time. backend is the decoded assignment's, or
// empty when the message did not decode. Safe for concurrent use, quick.
type Observer interface {
	Handled(backend taskassignment.BackendKind, o Outcome)
}

// Handle authenticates and decodes one message and offers it to the worker.
// A message that is unsigned, badly signed or tampered with (its repository,
// image, task or pool changed) is Poison before any backend call: no
// executor, no retry. An error of the worker that executor.IsPermanent is
// Rejected, any other Failed, offered again after ErrorBackoff of its
// delivery count; NotYet after NotYetDelay.
func (h Handler) Handle(ctx context.Context, d Delivery) Decision {
	dec := h.handle(ctx, d.Body)
	switch dec.Outcome {
	case NotYet:
		dec.RetryAfter = cmp.Or(h.NotYetDelay, DefaultNotYetDelay)
	case Failed:
		dec.RetryAfter = ErrorBackoff(cmp.Or(h.ErrorDelay, DefaultErrorDelay), d.Count)
	case Poison:
		dec.Reason = "malformed assignment"
		if errors.Is(dec.Err, assignmentsig.ErrUnauthenticated) {
			dec.Reason = "unauthenticated assignment"
		}
	case Rejected:
		dec.Reason = taskassignment.RejectedReason(dec.Assignment.ID, dec.Err.Error())
	}
	if h.Observer != nil {
		h.Observer.Handled(dec.Assignment.Backend, dec.Outcome)
	}
	return dec
}

// ShuttingDown is the decision on a message its adapter hands back unoffered
// because it is shutting down: Failed, to come again at once, with the
// assignment decoded (zero when it does not decode) for the adapter to name
// it should this be its last delivery. The worker is not asked; the
// Observer does not hear of it.
func (h Handler) ShuttingDown(body []byte) Decision {
	a, _, _ := h.decode(body)
	return Decision{Assignment: a, Outcome: Failed, Err: errShutdown}
}

func (h Handler) handle(ctx context.Context, body []byte) Decision {
	a, outcome, err := h.decode(body)
	if err != nil {
		return Decision{Assignment: a, Outcome: outcome, Err: err}
	}
	ok, err := h.Worker.Accept(ctx, a)
	switch {
	case err != nil && executor.IsPermanent(err):
		return Decision{Assignment: a, Outcome: Rejected, Err: err}
	case err != nil:
		return Decision{Assignment: a, Outcome: Failed, Err: err}
	case !ok:
		return Decision{Assignment: a, Outcome: NotYet}
	}
	return Decision{Assignment: a, Outcome: Accepted}
}

// decode authenticates and decodes body; the outcome is for an error only.
func (h Handler) decode(body []byte) (taskassignment.Assignment, Outcome, error) {
	if h.Keys == nil {
		return taskassignment.Assignment{}, Failed, errNoKeys
	}
	msg, err := h.Keys.Open(body)
	if err != nil {
		return taskassignment.Assignment{}, Poison, err
	}
	a, err := taskassignment.Decode(msg, h.TrustDomain)
	if err != nil {
		return a, Poison, err
	}
	return a, Accepted, nil
}

// errShutdown is the cause of a ShuttingDown decision.
var errShutdown = errors.New("handle is shutting down")
