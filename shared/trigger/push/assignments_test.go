package push

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor/executortest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// receiver serves Assignments over accept (the core deciding with the test keys) for the test's
// life, and returns its URL and a CloudEvents client to post to it.
func receiver(t *testing.T, accept handler.Acceptor) (string, cloudevents.Client) {
	t.Helper()
	h, err := Assignments{Decider: handler.Handler{Worker: accept, TrustDomain: td, Keys: jetstreamenv.Signer()}}.NewHTTPHandler(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	client, err := cloudevents.NewClientHTTP()
	if err != nil {
		t.Fatal(err)
	}
	return srv.URL, client
}

// assignmentEvent is an event of type typ carrying data, as the channel delivers dispatch's.
func assignmentEvent(t *testing.T, id, typ string, data []byte) cloudevents.Event {
	t.Helper()
	e := cloudevents.NewEvent()
	e.SetID(id)
	e.SetSource("dispatch/linux")
	e.SetType(typ)
	if err := e.SetData(cloudevents.ApplicationJSON, data); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestReceiverStatusCodes(t *testing.T) {
	good := handlertest.Encode(t, handlertest.Assignment(t, 11))
	for _, tc := range []struct {
		name      string
		eventType string
		data      []byte
		accept    handlertest.AcceptFunc
		want      int
	}{
		{"accepted", taskassignment.EventType, good, func(context.Context, taskassignment.Assignment) (bool, error) { return true, nil }, http.StatusAccepted},
		{"not yet", taskassignment.EventType, good, func(context.Context, taskassignment.Assignment) (bool, error) { return false, nil }, http.StatusServiceUnavailable},
		{"failed", taskassignment.EventType, good, func(context.Context, taskassignment.Assignment) (bool, error) { return false, errors.New("down") }, http.StatusInternalServerError},
		{"rejected", taskassignment.EventType, good, func(context.Context, taskassignment.Assignment) (bool, error) {
			return false, executor.Permanent(errors.New("invalid spec"))
		}, http.StatusOK}, // with a reply: TestReceiverRepliesToARejection
		{"poison", taskassignment.EventType, handlertest.Seal(t, jetstreamenv.Signer(), []byte(`{"version":1}`)), nil, http.StatusBadRequest},
		{"unsigned", taskassignment.EventType, handlertest.Raw(t, handlertest.Assignment(t, 11)), nil, http.StatusBadRequest},
		{"another type", "dev.example.other", good, nil, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, client := receiver(t, tc.accept)
			res := client.Send(cloudevents.ContextWithTarget(context.Background(), url), assignmentEvent(t, "linux-11", tc.eventType, tc.data))
			var httpRes *cehttp.Result
			if !cloudevents.ResultAs(res, &httpRes) {
				t.Fatalf("no HTTP result: %v", res)
			}
			if httpRes.StatusCode != tc.want {
				t.Fatalf("status = %d (%v), want %d", httpRes.StatusCode, res, tc.want)
			}
		})
	}
}

func TestReceiverAcceptsEndToEnd(t *testing.T) {
	backend := executortest.NewMemory("node-1")
	h, err := Assignments{Decider: handler.Handler{Worker: handlertest.Worker(t, backend), TrustDomain: td, Keys: jetstreamenv.Signer()}}.NewHTTPHandler(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a := handlertest.Assignment(t, 12)
	for i := range 2 {
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(handlertest.Encode(t, a)))
		for k, v := range map[string]string{
			"Content-Type": "application/json", "Ce-Specversion": "1.0", "Ce-Id": a.ID,
			"Ce-Source": "dispatch/linux", "Ce-Type": taskassignment.EventType,
		} {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusAccepted {
			t.Fatalf("delivery %d: status %d: %s", i+1, rec.Code, rec.Body)
		}
	}
	if backend.Creates() != 1 {
		t.Fatalf("%d creates for one assignment delivered twice", backend.Creates())
	}
}

// TestReceiverRepliesToARejection: an assignment the backend can never
// accept is acknowledged with a reply event that carries the signed
// assignment as it came and the reason, for the Subscription's reply to
// take to recover; nothing else answers with an event.
func TestReceiverRepliesToARejection(t *testing.T) {
	good := handlertest.Encode(t, handlertest.Assignment(t, 13))
	for _, tc := range []struct {
		name   string
		accept handlertest.AcceptFunc
		reply  bool
	}{
		{"rejected", func(context.Context, taskassignment.Assignment) (bool, error) {
			return false, executor.Permanent(errors.New("pool linux has no profile\nPod spec invalid"))
		}, true},
		{"accepted", func(context.Context, taskassignment.Assignment) (bool, error) { return true, nil }, false},
		{"failed", func(context.Context, taskassignment.Assignment) (bool, error) { return false, errors.New("down") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, client := receiver(t, tc.accept)
			resp, res := client.Request(cloudevents.ContextWithTarget(context.Background(), url), assignmentEvent(t, "linux-13", taskassignment.EventType, good))
			if !tc.reply {
				if resp != nil {
					t.Fatalf("reply %v to an assignment that was not rejected", resp)
				}
				return
			}
			if !cloudevents.IsACK(res) || resp == nil {
				t.Fatalf("no acknowledged reply: %v, %v", resp, res)
			}
			if resp.Type() != taskassignment.RejectionType {
				t.Errorf("reply type %q, want %q", resp.Type(), taskassignment.RejectionType)
			}
			if !bytes.Equal(resp.Data(), good) {
				t.Errorf("reply data is not the signed assignment as it came")
			}
			if got := fmt.Sprint(resp.Extensions()[taskassignment.ReasonExtension]); !strings.Contains(got, "pool linux has no profile") {
				t.Errorf("reply reason %q does not say why", got)
			}
		})
	}

}
