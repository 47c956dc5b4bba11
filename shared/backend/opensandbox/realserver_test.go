package opensandbox_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

// The tests of this file follow what the real server does where the
// specification is silent (docs/OPENSANDBOX.md, docs/OPENSANDBOX-KUBERNETES.md).

// A Failed sandbox's executor carries the server's account of why, which
// recover puts into the job's log; other states carry none.
func TestFailedSandboxReason(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a := assignment(t, "linux", 1)
	created := h.create(t, a)
	if e, err := h.backend.Find(ctx, a.ID); err != nil || e == nil || e.Reason != "" {
		t.Fatalf("Find of a running sandbox = %+v, %v: want no reason", e, err)
	}
	h.fake.SetState(created.Name, "Failed")
	e, err := h.backend.Find(ctx, a.ID)
	if err != nil || e == nil {
		t.Fatalf("Find = %+v, %v", e, err)
	}
	if e.Phase != executor.PhaseFailed || !strings.Contains(e.Reason, created.Name) || !strings.Contains(e.Reason, "test_transition") {
		t.Fatalf("Find = %+v: want failed, with the sandbox and the server's reason in Reason", e)
	}
}

// A create answered 504 (the Kubernetes runtime's K8S_POD_READY_TIMEOUT:
// the server made the sandbox and gave up waiting for its Pod) is retried
// by looking first: the sandbox that exists is adopted, with an event that
// names the answer, and no second one is created.
func TestCreateAdoptsTheSandboxOfATimedOutCreate(t *testing.T) {
	h := newHarness(t)
	a := assignment(t, "linux", 1)
	h.fake.Inject(sandboxapitest.Fault{Method: http.MethodPost, Status: http.StatusGatewayTimeout, AfterEffect: true})
	e, err := h.backend.Create(context.Background(), a, h.launch(t, a))
	if err != nil {
		t.Fatal(err)
	}
	// The fault happened: the one create took effect, its answer was 504.
	if n := h.fake.Creates(); n != 1 {
		t.Fatalf("%d creates, want exactly 1", n)
	}
	if e.Name != h.fake.Created()[0].ID {
		t.Fatalf("Create returned %s, not the sandbox the timed-out create made (%s)", e.Name, h.fake.Created()[0].ID)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var adopted *opensandbox.Event
	for i := range h.events {
		if h.events[i].Name == opensandbox.EventCreateAdopted {
			adopted = &h.events[i]
		}
	}
	var apiErr *sandboxapi.APIError
	if adopted == nil || adopted.SandboxID != e.Name || adopted.AssignmentID != a.ID || !errors.As(adopted.Err, &apiErr) || apiErr.Status != http.StatusGatewayTimeout {
		t.Fatalf("events = %+v: want %s for %s naming the 504", h.events, opensandbox.EventCreateAdopted, e.Name)
	}
}

// A pool whose job timeout exceeds the server's maximum gets sandboxes of
// the maximum (the server refuses a longer timeout with 400), with one
// warning when the backend is built.
func TestPoolTimeoutClampedToTheServersMaximum(t *testing.T) {
	for _, tc := range []struct {
		name    string
		max     time.Duration
		job     time.Duration
		want    time.Duration
		clamped bool
	}{
		{"within the default maximum", 0, 90 * time.Minute, 90 * time.Minute, false},
		{"beyond the default maximum", 0, 48 * time.Hour, opensandbox.DefaultMaxTimeout, true},
		{"beyond a configured maximum", 2 * time.Hour, 3 * time.Hour, 2 * time.Hour, true},
		{"below the API's minimum", 0, 10 * time.Second, time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logged bytes.Buffer
			h := newHarness(t, func(c *opensandbox.Config) {
				c.MaxTimeout = tc.max
				c.Log = slog.New(slog.NewTextHandler(&logged, nil))
				c.Pools[0].JobTimeout = runnerpool.Duration(tc.job)
			})
			h.create(t, assignment(t, "linux", 1))
			if got := time.Duration(h.fake.Created()[0].Timeout) * time.Second; got != tc.want {
				t.Errorf("sandbox timeout %s, want %s", got, tc.want)
			}
			if warned := strings.Contains(logged.String(), "exceeds the OpenSandbox server's maximum") && strings.Contains(logged.String(), "pool=linux"); warned != tc.clamped {
				t.Errorf("warning logged: %v, want %v (log: %q)", warned, tc.clamped, logged.String())
			}
			h.noRejections(t)
		})
	}
	_, err := opensandbox.New(opensandbox.Config{Sandboxes: newHarness(t).client, Keys: testKeys(t), TrustDomain: td, Pools: testPools(), MaxTimeout: 30 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "maximum sandbox timeout") {
		t.Fatalf("New with a maximum below a minute = %v", err)
	}
}

// A sandbox that is gone (expired, or deleted by someone else) answers 404;
// binding its identity fails saying so, and Find no longer sees it.
func TestBindIdentityOfAGoneSandbox(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a := assignment(t, "linux", 1)
	e := h.create(t, a)
	if err := h.client.Delete(ctx, e.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Get(ctx, e.Name); !sandboxapi.IsNotFound(err) { // the fault happened
		t.Fatalf("Get of the deleted sandbox = %v, want 404", err)
	}
	err := h.backend.BindIdentity(ctx, e, a.Identity)
	if !sandboxapi.IsNotFound(err) || !strings.Contains(err.Error(), "gone") || !strings.Contains(err.Error(), e.Name) {
		t.Fatalf("BindIdentity = %v: want a 404 that says the sandbox is gone", err)
	}
	if found, err := h.backend.Find(ctx, a.ID); found != nil || err != nil {
		t.Fatalf("Find = %+v, %v: want nothing", found, err)
	}
}
