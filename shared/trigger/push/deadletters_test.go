package push

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

var td = handlertest.TrustDomain

type failer struct {
	mu      sync.Mutex
	ids     []string
	reasons []string
	err     error
}

func (f *failer) DeadLetter(_ context.Context, a taskassignment.Assignment, reason string) (taskassignment.DeadLetterOutcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return 0, f.err
	}
	f.ids = append(f.ids, a.ID)
	f.reasons = append(f.reasons, reason)
	return taskassignment.DeadLetterFailed, nil
}

func TestDeadLetters(t *testing.T) {
	a := handlertest.Assignment(t, 9)
	sealed := func(t *testing.T, s *assignmentsig.Signer) []byte {
		t.Helper()
		msg, err := taskassignment.Encode(a)
		if err != nil {
			t.Fatal(err)
		}
		out, err := s.Seal(msg)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	other, err := assignmentsig.NewSigner(secretkey.Key(bytes.Repeat([]byte{5}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	good := sealed(t, jetstreamenv.Signer())
	for _, tc := range []struct {
		name       string
		eventType  string
		data       []byte
		ext        map[string]string
		failErr    error
		want       int
		wantReason string // "" when Failer must not be called
	}{
		{"dead-lettered after 503s", taskassignment.EventType, good,
			map[string]string{ErrorCodeExtension: "503", ErrorDataExtension: base64.StdEncoding.EncodeToString([]byte("assignment linux-9: identity target pending"))},
			nil, http.StatusOK, "ran out of deliveries before an executor took it (handle answered HTTP 503: assignment linux-9: identity target pending)"},
		{"dead-lettered without an answer", taskassignment.EventType, good, nil, nil, http.StatusOK, "(handle gave no answer)"},
		{"handle's rejection", taskassignment.RejectionType, good,
			map[string]string{taskassignment.ReasonExtension: "pool linux has no profile\tsecond line"},
			nil, http.StatusOK, "handle refused its assignment: pool linux has no profile second line"},
		{"unsigned", taskassignment.EventType, []byte(`{"version":1}`), nil, nil, http.StatusBadRequest, ""},
		{"signed by another key", taskassignment.RejectionType, sealed(t, other), nil, nil, http.StatusBadRequest, ""},
		{"another type", "dev.example.other", good, nil, nil, http.StatusBadRequest, ""},
		{"failing fails", taskassignment.EventType, good, nil, errors.New("gitea: 503"), http.StatusInternalServerError, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &failer{err: tc.failErr}
			h, err := DeadLetters{Failer: f, Keys: jetstreamenv.Signer(), TrustDomain: td}.NewHTTPHandler(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			c, err := cloudevents.NewClientHTTP()
			if err != nil {
				t.Fatal(err)
			}
			e := cloudevents.NewEvent()
			e.SetID(a.ID)
			e.SetSource("/channel")
			e.SetType(tc.eventType)
			for k, v := range tc.ext {
				e.SetExtension(k, v)
			}
			if err := e.SetData(cloudevents.ApplicationJSON, tc.data); err != nil {
				t.Fatal(err)
			}
			res := c.Send(cloudevents.ContextWithTarget(t.Context(), srv.URL), e)
			var hr *cehttp.Result
			if !cloudevents.ResultAs(res, &hr) || hr.StatusCode != tc.want {
				t.Fatalf("answer %v, want %d", res, tc.want)
			}
			if tc.wantReason == "" {
				if len(f.ids) != 0 {
					t.Fatalf("Failer called for %v", f.ids)
				}
				return
			}
			if len(f.ids) != 1 || f.ids[0] != a.ID || !strings.Contains(f.reasons[0], tc.wantReason) {
				t.Fatalf("Failer got %v %q, want %s with %q", f.ids, f.reasons, a.ID, tc.wantReason)
			}
		})
	}
}

// blockingFailer holds each DeadLetter until release, and records whether
// its context was cancelled meanwhile.
type blockingFailer struct {
	started, release chan struct{}
	cancelled        chan bool
}

func (f blockingFailer) DeadLetter(ctx context.Context, _ taskassignment.Assignment, _ string) (taskassignment.DeadLetterOutcome, error) {
	close(f.started)
	<-f.release
	f.cancelled <- ctx.Err() != nil
	return taskassignment.DeadLetterFailed, nil
}

// TestDeadLetterOutlivesItsRequest: a sender that goes away while recover
// fails the task does not cut the work off half done.
func TestDeadLetterOutlivesItsRequest(t *testing.T) {
	f := blockingFailer{started: make(chan struct{}), release: make(chan struct{}), cancelled: make(chan bool, 1)}
	h, err := DeadLetters{Failer: f, Keys: jetstreamenv.Signer(), TrustDomain: td}.NewHTTPHandler(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	msg, err := taskassignment.Encode(handlertest.Assignment(t, 10))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := jetstreamenv.Signer().Seal(msg)
	if err != nil {
		t.Fatal(err)
	}
	e := cloudevents.NewEvent()
	e.SetID("linux-10")
	e.SetSource("/channel")
	e.SetType(taskassignment.EventType)
	if err := e.SetData(cloudevents.ApplicationJSON, sealed); err != nil {
		t.Fatal(err)
	}
	c, err := cloudevents.NewClientHTTP()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Send(cloudevents.ContextWithTarget(ctx, srv.URL), e)
	}()
	<-f.started
	cancel() // the sender gives up
	<-done
	time.Sleep(50 * time.Millisecond) // the server sees the connection close
	close(f.release)
	if <-f.cancelled {
		t.Fatal("DeadLetter's context was cancelled with its request")
	}
}
