package handler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

var td = handlertest.TrustDomain

// outcomes records what an Observer hears.
type outcomes struct {
	seen []struct {
		b taskassignment.BackendKind
		o Outcome
	}
}

func (r *outcomes) Handled(b taskassignment.BackendKind, o Outcome) {
	r.seen = append(r.seen, struct {
		b taskassignment.BackendKind
		o Outcome
	}{b, o})
}

func TestHandlerOutcomes(t *testing.T) {
	assignment, encode, raw, seal, tamper, never := handlertest.Assignment, handlertest.Encode, handlertest.Raw, handlertest.Seal, handlertest.Tamper, handlertest.Never
	good := encode(t, assignment(t, 1))
	stranger, err := assignmentsig.NewSigner(secretkey.Key(bytes.Repeat([]byte{1}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		body   []byte
		accept handlertest.AcceptFunc
		want   Outcome
	}{
		{"accepted", good, func(context.Context, taskassignment.Assignment) (bool, error) { return true, nil }, Accepted},
		{"not yet", good, func(context.Context, taskassignment.Assignment) (bool, error) { return false, nil }, NotYet},
		{"failed", good, func(context.Context, taskassignment.Assignment) (bool, error) { return false, errors.New("api down") }, Failed},
		{"rejected", good, func(context.Context, taskassignment.Assignment) (bool, error) {
			return false, fmt.Errorf("create: %w", executor.Permanent(errors.New("invalid spec")))
		}, Rejected},
		{"poison", seal(t, jetstreamenv.Signer(), []byte("{")), never, Poison},
		{"poison from another trust domain", seal(t, jetstreamenv.Signer(), bytes.ReplaceAll(raw(t, assignment(t, 1)), []byte("ci.example.org"), []byte("evil.example.org"))), never, Poison},
		// Forged assignments: anything that reaches NATS could publish these.
		{"unsigned", raw(t, assignment(t, 1)), never, Poison},
		{"not even JSON", []byte("{"), never, Poison},
		{"signed with a wrong key", seal(t, stranger, raw(t, assignment(t, 1))), never, Poison},
		{"repository changed", tamper(t, good, "alice/repo", "mallory/repo"), never, Poison},
		{"image changed", tamper(t, encode(t, handlertest.WithImage(assignment(t, 1), "golang:1.26")), "golang:1.26", "evil/miner:1"), never, Poison},
		{"task changed", tamper(t, good, `"id":1,`, `"id":2,`), never, Poison},
		{"pool changed", tamper(t, good, `"pool":"linux"`, `"pool":"gpu"`), never, Poison},
		// A genuine message replayed after its expiry (kept from the queue, say).
		{"expired", seal(t, jetstreamenv.Signer().WithTTL(time.Hour).WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) }), raw(t, assignment(t, 1))), never, Poison},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &outcomes{}
			d := Handler{Worker: tc.accept, TrustDomain: td, Keys: jetstreamenv.Signer(), Observer: obs}.Handle(context.Background(), Delivery{Body: tc.body, Count: 1})
			if d.Outcome != tc.want {
				t.Fatalf("Handle() = %v (%v), want %v", d.Outcome, d.Err, tc.want)
			}
			// The Observer hears every outcome once, with the backend of
			// what decoded (process) or none.
			if len(obs.seen) != 1 || obs.seen[0].o != d.Outcome || (d.Outcome != Poison && obs.seen[0].b != taskassignment.BackendProcess) {
				t.Fatalf("observed %+v, want one %v", obs.seen, d.Outcome)
			}
			if (d.Err != nil) != (tc.want == Failed || tc.want == Poison || tc.want == Rejected) {
				t.Fatalf("Handle() error = %v for outcome %v", d.Err, d.Outcome)
			}
		})
	}
	// Without keys nothing is accepted, and nothing is lost either.
	d := Handler{Worker: handlertest.AcceptFunc(never), TrustDomain: td}.Handle(context.Background(), Delivery{Body: good})
	if d.Outcome != Failed || d.Err == nil {
		t.Fatalf("Handle() without keys = %v (%v), want failed", d.Outcome, d.Err)
	}
}

// The decision carries what its adapter needs: when to offer a message
// again (NotYetDelay; ErrorDelay doubled per delivery) and why one is
// dropped (the termination reason; a rejection's names the assignment, for
// recover to fail its task with).
func TestDecisionDelaysAndReasons(t *testing.T) {
	a := handlertest.Assignment(t, 7)
	good := handlertest.Encode(t, a)
	answer := func(ok bool, err error) handlertest.AcceptFunc {
		return func(context.Context, taskassignment.Assignment) (bool, error) { return ok, err }
	}
	for _, tc := range []struct {
		name       string
		h          Handler
		d          Delivery
		want       Outcome
		retryAfter time.Duration
		reason     string
	}{
		{"accepted: no delay, no reason", Handler{Worker: answer(true, nil)}, Delivery{Body: good, Count: 3}, Accepted, 0, ""},
		{"not yet: NotYetDelay", Handler{Worker: answer(false, nil), NotYetDelay: 3 * time.Second}, Delivery{Body: good, Count: 4}, NotYet, 3 * time.Second, ""},
		{"not yet: its default", Handler{Worker: answer(false, nil)}, Delivery{Body: good, Count: 1}, NotYet, DefaultNotYetDelay, ""},
		{"failed, first delivery", Handler{Worker: answer(false, errors.New("api down")), ErrorDelay: time.Second}, Delivery{Body: good, Count: 1}, Failed, time.Second, ""},
		{"failed, third delivery", Handler{Worker: answer(false, errors.New("api down")), ErrorDelay: time.Second}, Delivery{Body: good, Count: 3}, Failed, 4 * time.Second, ""},
		{"failed, count unknown", Handler{Worker: answer(false, errors.New("api down"))}, Delivery{Body: good}, Failed, DefaultErrorDelay, ""},
		{"unsigned", Handler{Worker: handlertest.AcceptFunc(handlertest.Never)}, Delivery{Body: handlertest.Raw(t, a)}, Poison, 0, "unauthenticated assignment"},
		{"signed, not an assignment", Handler{Worker: handlertest.AcceptFunc(handlertest.Never)}, Delivery{Body: handlertest.Seal(t, jetstreamenv.Signer(), []byte("{"))}, Poison, 0, "malformed assignment"},
		{"rejected", Handler{Worker: answer(false, executor.Permanent(errors.New("no profile")))}, Delivery{Body: good}, Rejected, 0,
			taskassignment.RejectedReason(a.ID, "no profile")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.h.TrustDomain, tc.h.Keys = td, jetstreamenv.Signer()
			d := tc.h.Handle(context.Background(), tc.d)
			if d.Outcome != tc.want || d.RetryAfter != tc.retryAfter || d.Reason != tc.reason {
				t.Fatalf("Handle() = %v after %v reason %q (%v), want %v after %v reason %q", d.Outcome, d.RetryAfter, d.Reason, d.Err, tc.want, tc.retryAfter, tc.reason)
			}
			if tc.want != Poison && d.Assignment.ID != a.ID {
				t.Fatalf("decision names assignment %q, want %q", d.Assignment.ID, a.ID)
			}
		})
	}
}

// A message handed back on shutdown is decided without the worker, and named
// when it decodes.
func TestShuttingDown(t *testing.T) {
	h := Handler{Worker: handlertest.AcceptFunc(handlertest.Never), TrustDomain: td, Keys: jetstreamenv.Signer()}
	a := handlertest.Assignment(t, 8)
	if d := h.ShuttingDown(handlertest.Encode(t, a)); d.Outcome != Failed || d.Assignment.ID != a.ID || !strings.Contains(d.Err.Error(), "shutting down") {
		t.Fatalf("ShuttingDown() = %+v", d)
	}
	if d := h.ShuttingDown([]byte("{")); d.Outcome != Failed || d.Assignment.ID != "" {
		t.Fatalf("ShuttingDown() of a malformed message = %+v", d)
	}
}

func ExampleOutcome() {
	for _, o := range []Outcome{Accepted, NotYet, Failed, Poison, Rejected} {
		fmt.Println(o)
	}
	// Output:
	// accepted
	// not_yet
	// failed
	// poison
	// rejected
}
