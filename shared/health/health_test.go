package health

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestProbes(t *testing.T) {
	failing := errors.New("nats://user:secret@nats:4222 unreachable")
	ok := func(context.Context) error { return nil }
	bad := func(context.Context) error { return failing }
	for _, tc := range []struct {
		name     string
		checks   []Check
		path     string
		wantCode int
		wantBody string
	}{
		{"no checks", nil, "/healthz", http.StatusOK, "ok\n"},
		{"all ready", []Check{{"nats", ok}, {"svid", ok}}, "/healthz", http.StatusOK, "ok\n"},
		{"one fails", []Check{{"nats", bad}, {"svid", ok}}, "/healthz", http.StatusServiceUnavailable, "not ready: nats\n"},
		{"both fail", []Check{{"nats", bad}, {"svid", bad}}, "/healthz", http.StatusServiceUnavailable, "not ready: nats, svid\n"},
		{"liveness never looks", []Check{{"nats", bad}}, "/livez", http.StatusOK, "alive\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			Probes{Checks: tc.checks}.Register(mux)
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
			body, _ := io.ReadAll(rec.Body)
			if rec.Code != tc.wantCode || string(body) != tc.wantBody {
				t.Fatalf("GET %s = %d %q, want %d %q", tc.path, rec.Code, body, tc.wantCode, tc.wantBody)
			}
			if strings.Contains(string(body), "secret") {
				t.Fatalf("the answer shows a check's error: %q", body)
			}
		})
	}
}

func TestCached(t *testing.T) {
	var calls atomic.Int32
	failing := errors.New("gitea down")
	result := error(nil)
	var mu sync.Mutex
	release := make(chan struct{})
	ready := func(ctx context.Context) error {
		calls.Add(1)
		<-release
		mu.Lock()
		defer mu.Unlock()
		return result
	}
	c := &cached{ttl: time.Minute, ready: ready}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	// A storm of 50 concurrent probes makes one call.
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.check(context.Background())
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("probe = %v", err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("50 probes made %d calls, want 1", n)
	}
	// Within the TTL the result is remembered, also when the dependency
	// has failed since; past it the failure is learned.
	mu.Lock()
	result = failing
	mu.Unlock()
	if err := c.check(context.Background()); err != nil || calls.Load() != 1 {
		t.Fatalf("within the TTL: %v after %d calls", err, calls.Load())
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	if err := c.check(context.Background()); !errors.Is(err, failing) || calls.Load() != 2 {
		t.Fatalf("past the TTL: %v after %d calls, want %v", err, calls.Load(), failing)
	}
	// A probe that gives up gets its context's error.
	stuck := &cached{ttl: time.Minute, ready: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, now: time.Now}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := stuck.check(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a probe that gives up = %v", err)
	}
}
