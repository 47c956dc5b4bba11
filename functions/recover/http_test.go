package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor/executortest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/health"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics/recovermetrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/push"
)

// In http mode a tick runs a pass that /metrics counts, and /healthz
// follows the NATS connection (503 once the server is gone).
func TestHTTPModeMetricsAndHealth(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	r := &recoverer.Recoverer{
		Backends: map[taskassignment.BackendKind]executor.Backend{taskassignment.BackendProcess: executortest.NewMemory("")},
		Pools:    map[string]recoverer.Pool{"linux": {Pool: runnerpool.Pool{Name: "linux", Backend: taskassignment.BackendProcess, Capacity: 1}}},
		Payloads: env.Payloads, Queue: env.Queue, Sender: env.Queue,
	}
	reg := metrics.NewRegistry()
	probes := health.Probes{Checks: []health.Check{{Name: "nats", Ready: natsconn.Connected(env.Conn)}}}
	h, err := handler(t.Context(), function.TickSettings{TickToken: "t1ck"}, r, push.DeadLetters{Failer: r}, probes, reg, recovermetrics.NewRecover(reg), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	get := func(path string) int {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	passes := func() float64 {
		t.Helper()
		fams, err := metrics.Scrape(t.Context(), srv.Client(), srv.URL+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		v, _ := fams.Value("gdr_recover_passes_total", "result", "ok")
		return v
	}
	if n := passes(); n != 0 {
		t.Fatalf("passes before a tick = %v", n)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/", nil)
	req.Header.Set("Authorization", "Bearer t1ck")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("tick: %d", resp.StatusCode)
	}
	if n := passes(); n != 1 {
		t.Fatalf("passes after a tick = %v, want 1", n)
	}
	if code := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz with NATS up = %d", code)
	}
	env.Server.Shutdown()
	deadline := time.Now().Add(5 * time.Second)
	for get("/healthz") != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/healthz not 503 5s after NATS stopped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := get("/livez"); code != http.StatusOK {
		t.Fatalf("/livez with NATS down = %d", code)
	}
}
