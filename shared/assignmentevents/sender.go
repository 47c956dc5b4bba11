// Package assignmentevents carries assignments as CloudEvents: the Knative
// path, where dispatch and recover send each assignment to the sink Knative
// injects (K_SINK, a NatsJetStreamChannel or a Broker) instead of publishing
// it on the JetStream queue, and where recover receives what the channel
// gives up on (DeadLetters).
//
// An assignment event is the JetStream message in another envelope: id = the
// assignment ID (the channel publishes it with the event id as Nats-Msg-Id,
// so a repeated send within the channel's duplicate window is stored once),
// type taskassignment.EventType, the extension BackendExtension naming the
// backend (a Trigger filters on it, or a channel per backend is its sink),
// and as data the signed assignment (assignmentsig), application/json, which
// handle authenticates before it trusts a byte. Nothing secret travels: the
// task itself stays in the payload store.
package assignmentevents

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

const (
	// BackendExtension names the assignment's backend on every event.
	BackendExtension = "gdrbackend"
	// SendTimeout bounds one send when the caller's context has no
	// earlier deadline: a channel's ingress answers once the event is
	// stored.
	SendTimeout = 10 * time.Second
)

// Signer signs an encoded assignment (assignmentsig.Signer).
type Signer interface {
	Seal(msg []byte) ([]byte, error)
}

// Sender sends assignments to one CloudEvents sink. Safe for concurrent use.
type Sender struct {
	client cloudevents.Client
	sink   string
	source string
	signer Signer
}

// NewSender returns a Sender to sink (an absolute http or https URL), with
// source as every event's source (e.g. "/gitea-dynamic-runner/dispatch"),
// signing with signer. It contacts nobody.
func NewSender(sink, source string, signer Signer) (*Sender, error) {
	u, err := url.Parse(sink)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("assignment events: sink %q is not an http(s) URL", sink)
	}
	if signer == nil {
		return nil, errors.New("assignment events: no signing key: no assignment is ever sent unsigned")
	}
	p, err := cloudevents.NewHTTP(cehttp.WithTarget(sink),
		cehttp.WithClient(http.Client{Timeout: SendTimeout}))
	if err != nil {
		return nil, fmt.Errorf("assignment events: sink %s: %w", u.Redacted(), err)
	}
	c, err := cloudevents.NewClient(p)
	if err != nil {
		return nil, fmt.Errorf("assignment events: sink %s: %w", u.Redacted(), err)
	}
	return &Sender{client: c, sink: u.Redacted(), source: source, signer: signer}, nil
}

// Event returns the signed event of a, as Send sends it.
func (s *Sender) Event(a taskassignment.Assignment) (cloudevents.Event, error) {
	if a.ID == "" {
		return cloudevents.Event{}, fmt.Errorf("assignment events: assignment of task %d has no ID", a.Task.ID)
	}
	if _, err := taskassignment.ParseBackendKind(string(a.Backend)); err != nil {
		return cloudevents.Event{}, fmt.Errorf("assignment events: assignment %s: %w", a.ID, err)
	}
	msg, err := taskassignment.Encode(a)
	if err != nil {
		return cloudevents.Event{}, fmt.Errorf("assignment events: encode assignment %s: %w", a.ID, err)
	}
	sealed, err := s.signer.Seal(msg)
	if err != nil {
		return cloudevents.Event{}, fmt.Errorf("assignment events: sign assignment %s: %w", a.ID, err)
	}
	e := cloudevents.NewEvent()
	e.SetID(a.ID)
	e.SetType(taskassignment.EventType)
	e.SetSource(s.source)
	e.SetExtension(BackendExtension, string(a.Backend))
	if err := e.SetData(cloudevents.ApplicationJSON, sealed); err != nil {
		return cloudevents.Event{}, fmt.Errorf("assignment events: assignment %s: %w", a.ID, err)
	}
	return e, nil
}

// Send sends a to the sink and returns once the sink acknowledged it (2xx):
// the channel has stored it. Any other answer, or none, is an error naming
// the assignment and the sink's status; the caller's payload stays, so
// recover sends it again. Sending one assignment twice is safe: the event id
// is its ID.
func (s *Sender) Send(ctx context.Context, a taskassignment.Assignment) error {
	e, err := s.Event(a)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, SendTimeout)
		defer cancel()
	}
	res := s.client.Send(ctx, e)
	if cloudevents.IsACK(res) {
		return nil
	}
	var hr *cehttp.Result
	if cloudevents.ResultAs(res, &hr) {
		return fmt.Errorf("assignment events: send assignment %s to %s: answered %d", a.ID, s.sink, hr.StatusCode)
	}
	return fmt.Errorf("assignment events: send assignment %s to %s: %w", a.ID, s.sink, res)
}
