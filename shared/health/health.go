// Package health answers a component's probes: liveness (the process serves
// HTTP: cheap, never looks at a dependency) and readiness (every dependency
// the component needs is usable now).
//
// Invariants: an answer carries one word ("ok", "alive") or the names of
// the checks that failed, never a check's error (which could name a host or
// an account); failures are logged instead, at Warn.
package health

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Timeout bounds one readiness check: a probe must answer before the
// kubelet gives up on it (1 s by default, but commonly raised).
const Timeout = 2 * time.Second

// Check is one dependency's readiness check.
type Check struct {
	// Name names the dependency in a failed answer ("nats", "svid").
	Name string
	// Ready returns nil when the dependency is usable. It must return by
	// the time ctx ends.
	Ready func(ctx context.Context) error
}

// Probes are a component's readiness checks.
type Probes struct {
	Checks []Check
	Log    *slog.Logger
}

// Register serves GET /healthz (readiness: 200 "ok" when every check
// passes, 503 naming the failed checks otherwise) and GET /livez (always
// 200 "alive") on mux. Probes without checks are always ready.
func (p Probes) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", p.ready)
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { answer(w, http.StatusOK, "alive") })
}

func (p Probes) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), Timeout)
	defer cancel()
	var failed []string
	for _, c := range p.Checks {
		if err := c.Ready(ctx); err != nil {
			failed = append(failed, c.Name)
			if p.Log != nil {
				p.Log.Warn("not ready", slog.String("check", c.Name), slog.Any("error", err))
			}
		}
	}
	if len(failed) > 0 {
		answer(w, http.StatusServiceUnavailable, "not ready: "+strings.Join(failed, ", "))
		return
	}
	answer(w, http.StatusOK, "ok")
}

func answer(w http.ResponseWriter, code int, word string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(word + "\n"))
}

// Cached returns ready with its result remembered for ttl: a storm of
// probes (several kubelets, a load balancer, a person's curl loop) costs
// the dependency one call per ttl. Concurrent probes that find no fresh
// result wait for one call instead of each making their own; a probe whose
// context ends first gets its context's error, and the call goes on for the
// next probe's benefit, bounded by Timeout.
func Cached(ttl time.Duration, ready func(ctx context.Context) error) func(ctx context.Context) error {
	c := &cached{ttl: ttl, ready: ready, now: time.Now}
	return c.check
}

type cached struct {
	ttl   time.Duration
	ready func(ctx context.Context) error
	now   func() time.Time

	mu       sync.Mutex
	at       time.Time     // when err was learned; zero: never
	err      error         // the last call's result
	inflight chan struct{} // closed when the call in flight ends; nil: none
}

func (c *cached) check(ctx context.Context) error {
	c.mu.Lock()
	if !c.at.IsZero() && c.now().Sub(c.at) < c.ttl {
		err := c.err
		c.mu.Unlock()
		return err
	}
	done := c.inflight
	if done == nil {
		done = make(chan struct{})
		c.inflight = done
		go c.call(done)
	}
	c.mu.Unlock()
	select {
	case <-done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// call asks the dependency once, on a context of its own (a probe that
// gives up does not cut the call short for the others).
func (c *cached) call(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	err := c.ready(ctx)
	c.mu.Lock()
	c.err, c.at, c.inflight = err, c.now(), nil
	c.mu.Unlock()
	close(done)
}
