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

// A sandbox whose entrypoint exited is finished at once, as each runtime
// shows it: on Docker Terminated (exit 0) or Failed (exit != 0, a container
// killed mid-job: 137); on Kubernetes, whose Pod restarts the container,
// Pending and then Failed once it is in CrashLoopBackOff, never Terminated.
// A Failed sandbox's executor carries the server's account of why, which
// recover puts into the job's log; other states carry none.
func TestFinishedSandboxPhaseAndReason(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       []sandboxapitest.Option
		code       int
		want       executor.Phase
		wantReason []string
	}{
		{"docker exit 0", nil, 0, executor.PhaseSucceeded, nil},
		{"docker killed", nil, 137, executor.PhaseFailed, []string{"CONTAINER_EXITED_ERROR", "exited with code 137"}},
		{"kubernetes exit 0", []sandboxapitest.Option{sandboxapitest.WithRuntime(sandboxapitest.Kubernetes), sandboxapitest.WithCrashLoopBackOff(50 * time.Millisecond)},
			0, executor.PhaseFailed, []string{"CrashLoopBackOff"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessOn(t, tc.opts)
			ctx := context.Background()
			a := assignment(t, "linux", 1)
			created := h.create(t, a)
			if e, err := h.backend.Find(ctx, a.ID); err != nil || e == nil || e.Phase != executor.PhaseRunning || e.Reason != "" {
				t.Fatalf("Find of a running sandbox = %+v, %v: want running, no reason", e, err)
			}
			h.fake.Exit(created.Name, tc.code)
			var e *executor.Executor
			deadline := time.Now().Add(5 * time.Second)
			for {
				var err error
				if e, err = h.backend.Find(ctx, a.ID); err != nil || e == nil {
					t.Fatalf("Find = %+v, %v", e, err)
				}
				if e.Phase.Terminal() || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if e.Phase != tc.want {
				t.Fatalf("Find = %+v, want phase %s", e, tc.want)
			}
			if tc.wantReason == nil && e.Reason != "" {
				t.Errorf("reason %q, want none", e.Reason)
			}
			for _, w := range tc.wantReason {
				if !strings.Contains(e.Reason, w) || !strings.Contains(e.Reason, created.Name) {
					t.Errorf("reason %q lacks %q or the sandbox %s", e.Reason, w, created.Name)
				}
			}
		})
	}
}

// An expired sandbox is removed by the server (404, never Terminated): Find
// and recovery no longer see it, and recover treats its task as one whose
// executor vanished (shared/recoverer).
func TestExpiredSandboxIsGone(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a := assignment(t, "linux", 1)
	e := h.create(t, a)
	h.fake.Expire(e.Name)
	if _, err := h.client.Get(ctx, e.Name); !sandboxapi.IsNotFound(err) { // the fault happened
		t.Fatalf("Get of the expired sandbox = %v, want 404", err)
	}
	if found, err := h.backend.Find(ctx, a.ID); found != nil || err != nil {
		t.Fatalf("Find = %+v, %v: want nothing", found, err)
	}
	if as, err := h.backend.RecoverAssignments(ctx); len(as) != 0 || err != nil {
		t.Fatalf("RecoverAssignments = %v, %v: want none", as, err)
	}
	if err := h.backend.Delete(ctx, e); err != nil {
		t.Fatalf("Delete of the expired sandbox = %v, want success", err)
	}
}

// A create answered 504 by the Kubernetes runtime
// (KUBERNETES::POD_READY_TIMEOUT: its Pod was not ready within the server's
// wait) is retried by looking first. Where the sandbox stays (a proxy timed
// out first, the server's cleanup failed) it is adopted, with an event
// naming the answer; where the server removed it, as it means to, one is
// created again. Either way one sandbox is left.
func TestCreateAfterAPodReadyTimeout(t *testing.T) {
	for _, tc := range []struct {
		name        string
		keep        bool
		wantCreates int
		wantEvent   opensandbox.EventName
	}{
		{"sandbox kept: adopted", true, 1, opensandbox.EventCreateAdopted},
		{"sandbox removed: created again", false, 2, opensandbox.EventCreateRetried},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessOn(t, []sandboxapitest.Option{sandboxapitest.WithRuntime(sandboxapitest.Kubernetes)})
			a := assignment(t, "linux", 1)
			h.fake.InjectPodReadyTimeout(tc.keep)
			e, err := h.backend.Create(context.Background(), a, h.launch(t, a))
			if err != nil {
				t.Fatal(err)
			}
			if n := h.fake.Creates(); n != tc.wantCreates {
				t.Fatalf("%d creates, want %d", n, tc.wantCreates)
			}
			if live := h.fake.Sandboxes(); len(live) != 1 || live[0].ID != e.Name {
				t.Fatalf("sandboxes left %+v, want exactly %s", live, e.Name)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			var got *opensandbox.Event
			for i := range h.events {
				if h.events[i].Name == tc.wantEvent {
					got = &h.events[i]
				}
			}
			var apiErr *sandboxapi.APIError
			if got == nil || got.AssignmentID != a.ID || !errors.As(got.Err, &apiErr) || apiErr.Status != http.StatusGatewayTimeout {
				t.Fatalf("events = %+v: want %s for %s naming the 504", h.events, tc.wantEvent, a.ID)
			}
		})
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
