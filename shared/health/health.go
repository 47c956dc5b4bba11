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
