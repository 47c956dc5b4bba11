// Package handler hands assignment messages from the queue to a worker. It is
// the core of the `handle` function; its two trigger adapters are the KEDA job
// mode (Job: pull a few messages, exit) and the Knative mode (Receiver: one
// CloudEvent per HTTP request).
//
// Both adapters share one decision per message (see Outcome): acknowledge once
// the backend holds every recovery fact, redeliver later when that is not yet
// so or something transient failed, and terminate a message that can never
// decode (Poison) or whose assignment can never be accepted (Rejected: the
// backend said so with executor.Permanent).
package handler

import (
	"context"
	"errors"
	"log/slog"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

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

// Handler decides the fate of assignment messages.
type Handler struct {
	Worker      Acceptor
	TrustDomain spiffeid.TrustDomain
	// Keys authenticates every message before any byte of it is trusted. A
	// Handler without Keys accepts nothing (and loses nothing: Failed).
	Keys Opener
	Log  *slog.Logger
	// Observer, when set, hears the outcome of every Handle.
	Observer Observer
}

// Observer hears the outcome of every message handled (metrics): once per
// offer, so an assignment offered again while its identity target is
// pending counts NotYet each time. backend is the decoded assignment's, or
// empty when the message did not decode. Safe for concurrent use, quick.
type Observer interface {
	Handled(backend taskassignment.BackendKind, o Outcome)
}

// Handle authenticates and decodes one message body and offers it to the
// worker. A message that is unsigned, badly signed or tampered with (its
// repository, image, task or pool changed) is Poison before any backend
// call: no executor, no retry. An error of the worker that
// executor.IsPermanent is Rejected, any other Failed. The error, when
// there is one, says why the outcome is Failed, Poison or Rejected; it never
// carries a credential (assignment messages hold none).
func (h Handler) Handle(ctx context.Context, body []byte) (taskassignment.Assignment, Outcome, error) {
	a, outcome, err := h.handle(ctx, body)
	if h.Observer != nil {
		h.Observer.Handled(a.Backend, outcome)
	}
	return a, outcome, err
}

func (h Handler) handle(ctx context.Context, body []byte) (taskassignment.Assignment, Outcome, error) {
	a, outcome, err := h.decode(body)
	if err != nil {
		return a, outcome, err
	}
	ok, err := h.Worker.Accept(ctx, a)
	switch {
	case err != nil && executor.IsPermanent(err):
		return a, Rejected, err
	case err != nil:
		return a, Failed, err
	case !ok:
		return a, NotYet, nil
	}
	return a, Accepted, nil
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

func (h Handler) log() *slog.Logger {
	if h.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Log
}

// errShutdown is the cause a Job gives to messages it hands back on shutdown.
var errShutdown = errors.New("handle is shutting down")
