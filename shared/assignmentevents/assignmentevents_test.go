package assignmentevents

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

func assignment(t *testing.T, id int64) taskassignment.Assignment {
	t.Helper()
	identity, err := taskidentity.New(td, "alice/repo", "build", id)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: id, Pool: "linux"}, identity)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// receiver is a CloudEvents sink built with sdk-go, answering status.
type receiver struct {
	mu     sync.Mutex
	events []cloudevents.Event
	status int
}

func (r *receiver) serve(t *testing.T) string {
	t.Helper()
	p, err := cloudevents.NewHTTP()
	if err != nil {
		t.Fatal(err)
	}
	h, err := cloudevents.NewHTTPReceiveHandler(t.Context(), p, func(e cloudevents.Event) cloudevents.Result {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.events = append(r.events, e)
		return cehttp.NewResult(r.status, "stored")
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestSendCarriesTheSignedAssignment: the event's id is the assignment ID,
// its type the assignment type, its backend extension the backend, and its
// data the signed assignment handle opens and decodes back to the same one.
func TestSendCarriesTheSignedAssignment(t *testing.T) {
	r := &receiver{status: http.StatusAccepted}
	s, err := NewSender(r.serve(t), "/gitea-dynamic-runner/dispatch", jetstreamenv.Signer())
	if err != nil {
		t.Fatal(err)
	}
	a := assignment(t, 7)
	if err := s.Send(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	if len(r.events) != 1 {
		t.Fatalf("%d events received, want 1", len(r.events))
	}
	e := r.events[0]
	if e.ID() != a.ID || e.Type() != taskassignment.EventType || e.Source() != "/gitea-dynamic-runner/dispatch" {
		t.Errorf("event id %q type %q source %q", e.ID(), e.Type(), e.Source())
	}
	if got := e.Extensions()[BackendExtension]; got != "pod" {
		t.Errorf("backend extension %v, want pod", got)
	}
	msg, err := jetstreamenv.Signer().Open(e.Data())
	if err != nil {
		t.Fatalf("data is not signed by the sender's key: %v", err)
	}
	back, err := taskassignment.Decode(msg, td)
	if err != nil || back.ID != a.ID || back.Identity != a.Identity {
		t.Fatalf("decoded %+v, %v; want %+v", back, err, a)
	}
}

// TestSendFailures: a sink that does not acknowledge, or is not there, is an
// error naming the assignment; bad configuration is refused before any send.
func TestSendFailures(t *testing.T) {
	a := assignment(t, 8)
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusBadRequest} {
		r := &receiver{status: status}
		s, err := NewSender(r.serve(t), "/x", jetstreamenv.Signer())
		if err != nil {
			t.Fatal(err)
		}
		err = s.Send(context.Background(), a)
		if err == nil || !strings.Contains(err.Error(), a.ID) || !strings.Contains(err.Error(), fmt.Sprintf("answered %d", status)) {
			t.Errorf("sink answering %d: Send = %v, want an error naming %s and the answer", status, err, a.ID)
		}
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	s, err := NewSender(url, "/x", jetstreamenv.Signer())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(context.Background(), a); err == nil || !strings.Contains(err.Error(), a.ID) {
		t.Errorf("closed sink: Send = %v, want an error naming %s", err, a.ID)
	}
	for _, tc := range []struct {
		sink   string
		signer Signer
	}{{"", jetstreamenv.Signer()}, {"ftp://x", jetstreamenv.Signer()}, {"http://", jetstreamenv.Signer()}, {"http://sink", nil}} {
		if _, err := NewSender(tc.sink, "/x", tc.signer); err == nil {
			t.Errorf("NewSender(%q, signer %v) succeeded", tc.sink, tc.signer != nil)
		}
	}
}

// failer records the dead letters handed to it.
func TestPublishingCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       PublishSettings
		kSink   string
		want    string // "" for no error
		wantURL string
	}{
		{"jetstream", PublishSettings{Publish: "jetstream"}, "", "", ""},
		{"unknown", PublishSettings{Publish: "kafka"}, "", "GDR_PUBLISH", ""},
		{"cloudevents without a sink", PublishSettings{Publish: "cloudevents"}, "", "K_SINK", ""},
		{"cloudevents from K_SINK", PublishSettings{Publish: "cloudevents"}, "http://channel.ns.svc", "", "http://channel.ns.svc"},
		{"GDR_EVENT_SINK first", PublishSettings{Publish: "cloudevents", EventSink: "http://broker"}, "http://channel", "", "http://broker"},
		{"bad sink", PublishSettings{Publish: "cloudevents", EventSink: "channel:80"}, "", "GDR_EVENT_SINK: not an http(s) URL", ""},
		{"bad K_SINK", PublishSettings{Publish: "cloudevents"}, "/relative", "K_SINK: not an http(s) URL", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Check(tc.kSink)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check = %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check = %v, want an error with %q", err, tc.want)
			}
			if tc.wantURL != "" && tc.p.EventSink != tc.wantURL {
				t.Errorf("sink %q, want %q", tc.p.EventSink, tc.wantURL)
			}
		})
	}
}
