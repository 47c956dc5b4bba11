package metrics_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/metricsenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// A push reaches the Pushgateway as a PUT under the grouping key job and
// instance, its body the families of the registry pushed (and nothing
// else: not the Go runtime's), with their values; two runs (two Pods) push
// to two groups, so neither replaces the other's figures.
func TestPushSendsTheRunsFamiliesUnderItsGroup(t *testing.T) {
	pg := metricsenv.StartPushgateway(t)
	s := metrics.PushSettings{PushURL: pg.URL}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	for _, run := range []struct {
		pod      string
		outcomes []handler.Outcome
	}{
		{"handle-pod-abcde-x1", []handler.Outcome{handler.Accepted, handler.Poison}},
		{"handle-pod-fghij-y2", []handler.Outcome{handler.Accepted}},
	} {
		reg := prometheus.NewRegistry()
		o := metrics.NewOutcomes(reg)
		for _, out := range run.outcomes {
			o.Handled(taskassignment.BackendPod, out)
		}
		if err := s.Push(t.Context(), "gdr-handle", run.pod, reg); err != nil {
			t.Fatal(err)
		}
	}
	pushes := pg.Pushes()
	if len(pushes) != 2 {
		t.Fatalf("%d pushes, want 2", len(pushes))
	}
	for i, want := range []struct {
		path              string
		accepted, poisons float64
	}{
		{"/metrics/job/gdr-handle/instance/handle-pod-abcde-x1", 1, 1},
		{"/metrics/job/gdr-handle/instance/handle-pod-fghij-y2", 1, 0},
	} {
		p := pushes[i]
		if p.Method != http.MethodPut || p.Path != want.path {
			t.Errorf("push %d: %s %s, want PUT %s", i, p.Method, p.Path, want.path)
		}
		if len(p.Families) != 1 {
			t.Errorf("push %d holds %d families, want gdr_assignments_total alone", i, len(p.Families))
		}
		if v, _ := p.Families.Value("gdr_assignments_total", "backend", "pod", "outcome", "accepted"); v != want.accepted {
			t.Errorf("push %d: accepted = %v, want %v", i, v, want.accepted)
		}
		if v, _ := p.Families.Value("gdr_assignments_total", "backend", "pod", "outcome", "poison"); v != want.poisons {
			t.Errorf("push %d: poison = %v, want %v", i, v, want.poisons)
		}
	}
}

// A run that is ending (its context cancelled by SIGTERM) still pushes.
func TestPushAfterTheRunsContextEnded(t *testing.T) {
	pg := metricsenv.StartPushgateway(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	reg := prometheus.NewRegistry()
	metrics.NewOutcomes(reg).Handled(taskassignment.BackendPod, handler.Accepted)
	if err := (metrics.PushSettings{PushURL: pg.URL}).Push(ctx, "gdr-handle", "handle-pod-1", reg); err != nil {
		t.Fatal(err)
	}
	if n := len(pg.Pushes()); n != 1 {
		t.Fatalf("%d pushes after the context ended, want 1", n)
	}
}

// PushAtExit logs a Pushgateway's refusal at warn and returns: the run's
// exit does not depend on it. Its instance is the host's name.
func TestPushAtExitLogsAFailure(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "full", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	metrics.PushSettings{PushURL: srv.URL}.PushAtExit(t.Context(), "gdr-recover", prometheus.NewRegistry(), log)
	if !strings.Contains(logs.String(), "level=WARN msg=\"metrics not pushed\"") || !strings.Contains(logs.String(), "503") {
		t.Errorf("log %q, want the refusal at warn", logs.String())
	}
	logs.Reset()
	metrics.PushSettings{}.PushAtExit(t.Context(), "gdr-recover", prometheus.NewRegistry(), log)
	if logs.Len() != 0 {
		t.Errorf("no push URL, yet: %q", logs.String())
	}
}

// A Pushgateway that does not answer holds a run for PushTimeout at most.
func TestPushTimesOut(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for PushTimeout")
	}
	stuck := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-stuck }))
	t.Cleanup(func() { close(stuck); srv.Close() })
	start := time.Now()
	err := metrics.PushSettings{PushURL: srv.URL}.Push(t.Context(), "gdr-handle", "handle-pod-1", prometheus.NewRegistry())
	if took := time.Since(start); err == nil || took > metrics.PushTimeout+2*time.Second {
		t.Fatalf("push to a server that never answers: %v after %v, want an error within %v", err, took, metrics.PushTimeout)
	}
}

// Check takes a plain http(s) base URL and refuses anything else without
// echoing it (it could hold a password).
func TestPushSettingsCheck(t *testing.T) {
	for _, tc := range []struct {
		url, want string
	}{
		{"", ""},
		{"http://pushgateway.monitoring.svc:9091", ""},
		{"https://metrics.example.org/pushgateway/", ""},
		{"pushgateway:9091", "want a Pushgateway's base URL"},
		{"ftp://pushgateway:9091", "want a Pushgateway's base URL"},
		{"http://", "want a Pushgateway's base URL"},
		{"http://user:s3cret-pass@pushgateway:9091", "no credentials"},
		{"http://pushgateway:9091/?token=s3cret-pass", "no query"},
		{"http://pushgateway:9091/#s3cret-pass", "no query"},
		{"http://push gateway:9091", "want a Pushgateway's base URL"},
	} {
		err := metrics.PushSettings{PushURL: tc.url}.Check()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.url, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error with %q", tc.url, err, tc.want)
		case err != nil && (strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), tc.url)):
			t.Errorf("%q: the error shows the URL: %v", tc.url, err)
		}
	}
}
