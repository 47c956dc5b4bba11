package push

import (
	"context"
	"log/slog"
	"net/http"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/client"
	"github.com/cloudevents/sdk-go/v2/protocol"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// MaxEventBytes caps a CloudEvent request's body: an assignment is a few
// hundred bytes, and a body over the cap is never read whole (it can never
// be an assignment, so refusing it drops it).
const MaxEventBytes = 64 << 10

// Decider is what Assignments needs of handle's core (handler.Handler).
type Decider interface {
	Handle(ctx context.Context, d handler.Delivery) handler.Decision
}

// Assignments is handle's trigger adapter in the Knative mode: a
// NatsJetStreamChannel subscription delivers one CloudEvent per HTTP
// request, which the Decider decides. Knative acknowledges a 2xx,
// redelivers after a 5xx (with its backoff, so the decision's RetryAfter is
// not used) and terminates the message on any other 4xx, so:
//
//   - Accepted answers 202,
//   - NotYet answers 503 (Service Unavailable: deliver again),
//   - Failed answers 500,
//   - Poison (including an event of another type) answers 400, the only
//     answer that drops a message: nothing can make it an assignment;
//   - Rejected answers 200 with a reply event (taskassignment.RejectionType,
//     the signed assignment as data, the reason in
//     taskassignment.ReasonExtension): the channel
//     acknowledges the message and the Subscription's reply delivers the
//     event to recover's dead-letter sink, which fails the task with the
//     reason (a 4xx would drop the message with no reason anyone reads, and
//     the orphan step would send it again and again). Without a reply on the
//     Subscription the reason is lost and the task fails only when recover's
//     orphan step re-sends it and it is rejected again: ship the reply.
type Assignments struct {
	Decider Decider
	Log     *slog.Logger
}

// NewHTTPHandler returns the http.Handler to serve. ctx bounds the handler's
// life.
func (r Assignments) NewHTTPHandler(ctx context.Context) (http.Handler, error) {
	p, err := cloudevents.NewHTTP()
	if err != nil {
		return nil, err
	}
	return client.NewHTTPReceiveHandler(ctx, p, r.receive)
}

// rejection is the reply to a Rejected assignment: the signed assignment as
// it came (recover authenticates it) and why.
func rejection(in cloudevents.Event, id string, why error) *cloudevents.Event {
	e := cloudevents.NewEvent()
	e.SetID(id + ".rejected")
	e.SetType(taskassignment.RejectionType)
	e.SetSource("/gitea-dynamic-runner/handle")
	reason := taskassignment.ReasonLine(why.Error())
	e.SetExtension(taskassignment.ReasonExtension, reason)
	if err := e.SetData(cloudevents.ApplicationJSON, in.Data()); err != nil {
		return nil
	}
	return &e
}

func (r Assignments) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

func (r Assignments) receive(ctx context.Context, event cloudevents.Event) (*cloudevents.Event, protocol.Result) {
	log := r.log()
	attrs := []any{slog.String("event_id", event.ID()), slog.String("event_source", event.Source())}
	if event.Type() != taskassignment.EventType {
		log.Error("event of another type rejected", append(attrs, slog.String("event_type", event.Type()))...)
		return nil, cehttp.NewResult(http.StatusBadRequest, "event type %q is not %q", event.Type(), taskassignment.EventType)
	}
	d := r.Decider.Handle(ctx, handler.Delivery{Body: event.Data()})
	a, err := d.Assignment, d.Err
	if a.ID != "" {
		attrs = append(attrs, slog.String("assignment", a.ID), slog.Int64("task", a.Task.ID))
	}
	switch d.Outcome {
	case handler.Accepted:
		log.Info("assignment accepted", attrs...)
		return nil, cehttp.NewResult(http.StatusAccepted, "assignment %s accepted", a.ID)
	case handler.NotYet:
		log.Info("assignment waits for its identity target", attrs...)
		return nil, cehttp.NewResult(http.StatusServiceUnavailable, "assignment %s: identity target pending", a.ID)
	case handler.Poison:
		log.Error("malformed assignment event rejected", append(attrs, slog.Any("error", err))...)
		return nil, cehttp.NewResult(http.StatusBadRequest, "%v", err)
	case handler.Rejected:
		log.Error("assignment rejected: it can never be accepted; replying to recover", append(attrs, slog.Any("error", err))...)
		reply := rejection(event, a.ID, err)
		if reply == nil {
			return nil, cehttp.NewResult(http.StatusInternalServerError, "assignment %s: rejected, and its reply could not be made", a.ID)
		}
		return reply, cehttp.NewResult(http.StatusOK, "assignment %s rejected: %v", a.ID, err)
	default:
		log.Warn("assignment not accepted", append(attrs, slog.Any("error", err))...)
		return nil, cehttp.NewResult(http.StatusInternalServerError, "assignment %s: %v", a.ID, err)
	}
}
