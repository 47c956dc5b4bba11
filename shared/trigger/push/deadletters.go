package push

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/client"
	"github.com/cloudevents/sdk-go/v2/protocol"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// The extensions Knative puts on an event it dead-letters.
const (
	ErrorCodeExtension = "knativeerrorcode"
	ErrorDataExtension = "knativeerrordata"
)

// Opener authenticates a signed assignment (assignmentsig.Keyring).
type Opener interface {
	Open(sealed []byte) ([]byte, error)
}

// Failer ends the task of an assignment the channel gave up on: recover's
// core (recoverer.Recoverer) decides and does it.
type Failer interface {
	DeadLetter(ctx context.Context, a taskassignment.Assignment, reason string) (taskassignment.DeadLetterOutcome, error)
}

// FailTimeout bounds the work on one dead letter (a Gitea report, a
// backend lookup and delete, a payload delete), detached from its request.
const FailTimeout = 30 * time.Second

// DeadLetters is recover's trigger adapter in the Knative mode: it receives
// what the Knative path will deliver no more, and hands each to Failer:
// recover's dead-letter sink (POST /dead-letter). Two kinds
// of event reach it:
//
//   - an assignment event the channel dead-lettered after its last retry
//     (Knative's extensions knativeerrorcode and knativeerrordata say what
//     handle answered last): the task fails as having run out of deliveries;
//   - a taskassignment.RejectionType event, handle's reply to an assignment
//     it can never accept, with its reason in taskassignment.ReasonExtension:
//     the task fails with it.
//
// Either way the data must be an authentic assignment: nothing else can make
// recover fail a task, and Failer leaves any assignment an executor holds.
// Answers: 200 once handled (failed, held or not ours), 400 for an event that
// is not an authentic assignment or of another type (retrying cannot help),
// 500 when failing the task failed (deliver again; the payload also stays
// for the orphan step).
type DeadLetters struct {
	Failer      Failer
	Keys        Opener
	TrustDomain spiffeid.TrustDomain
	Log         *slog.Logger
}

// NewHTTPHandler returns the http.Handler to serve; ctx bounds its life.
// The caller caps the body (an assignment event is a few KiB).
func (d DeadLetters) NewHTTPHandler(ctx context.Context) (http.Handler, error) {
	p, err := cloudevents.NewHTTP()
	if err != nil {
		return nil, err
	}
	return client.NewHTTPReceiveHandler(ctx, p, d.receive)
}

func (d DeadLetters) log() *slog.Logger {
	if d.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Log
}

func (d DeadLetters) receive(ctx context.Context, e cloudevents.Event) protocol.Result {
	log := d.log().With(slog.String("event_id", e.ID()), slog.String("event_type", e.Type()))
	var reason string
	switch e.Type() {
	case taskassignment.EventType:
		reason = exhaustedReason(e)
	case taskassignment.RejectionType:
		reason = "handle refused its assignment: " + extension(e, taskassignment.ReasonExtension)
	default:
		log.Error("dead letter of another type refused")
		return cehttp.NewResult(http.StatusBadRequest, "event type %q is neither %q nor %q", e.Type(), taskassignment.EventType, taskassignment.RejectionType)
	}
	if d.Keys == nil {
		return cehttp.NewResult(http.StatusInternalServerError, "no keys to authenticate assignments with")
	}
	msg, err := d.Keys.Open(e.Data())
	if err != nil {
		log.Error("dead letter that is not an authentic assignment refused", slog.Any("error", err))
		return cehttp.NewResult(http.StatusBadRequest, "not an authentic assignment: %v", err)
	}
	a, err := taskassignment.Decode(msg, d.TrustDomain)
	if err != nil {
		log.Error("dead letter whose assignment does not decode refused", slog.Any("error", err))
		return cehttp.NewResult(http.StatusBadRequest, "assignment: %v", err)
	}
	log = log.With(slog.String("assignment", a.ID), slog.Int64("task", a.Task.ID))
	// Failing the task runs to its end even if the sender goes away (its
	// request timed out, the channel's dispatcher restarted): a report cut
	// off after Gitea took it would leave the payload, and its capacity,
	// until the orphan step.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FailTimeout)
	defer cancel()
	outcome, err := d.Failer.DeadLetter(fctx, a, reason)
	if err != nil {
		log.Warn("dead letter not handled; deliver it again", slog.Any("error", err))
		return cehttp.NewResult(http.StatusInternalServerError, "assignment %s: %v", a.ID, err)
	}
	log.Info("dead letter handled", slog.String("outcome", outcome.String()))
	return cehttp.NewResult(http.StatusOK, "assignment %s: %s", a.ID, outcome)
}

// exhaustedReason is the job log's line for a dead-lettered assignment: what
// handle last answered, when the channel said.
func exhaustedReason(e cloudevents.Event) string {
	const base = "its assignment ran out of deliveries before an executor took it"
	code := extension(e, ErrorCodeExtension)
	if code == "" || code == "0" {
		return base + " (handle gave no answer)"
	}
	why := base + " (handle answered HTTP " + code
	if raw, err := base64.StdEncoding.DecodeString(extension(e, ErrorDataExtension)); err == nil && len(raw) > 0 {
		why += ": " + taskassignment.ReasonLine(string(raw))
	}
	return why + ")"
}

// extension returns e's extension name as one printable line
// (taskassignment.ReasonLine); "" when absent.
func extension(e cloudevents.Event, name string) string {
	v, ok := e.Extensions()[name]
	if !ok {
		return ""
	}
	return taskassignment.ReasonLine(fmt.Sprint(v))
}
