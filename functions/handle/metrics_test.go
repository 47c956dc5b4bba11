package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/push"
)

// acceptAll is a worker whose backend takes every assignment.
type acceptAll struct{}

func (acceptAll) Accept(context.Context, taskassignment.Assignment) (bool, error) { return true, nil }

// Handle's http mode answers its probes and counts every event by outcome
// on /metrics: an accepted assignment and a forged (unsigned) one.
func TestHTTPModeProbesAndMetrics(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	reg := metrics.NewRegistry()
	h := handler.Handler{Worker: acceptAll{}, TrustDomain: td, Keys: jetstreamenv.Signer(), Observer: metrics.NewOutcomes(reg)}
	handler, err := httpHandler(t.Context(), push.Assignments{Decider: h}, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	for path, want := range map[string]int{"/healthz": http.StatusOK, "/livez": http.StatusOK} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s = %d, want %d", path, resp.StatusCode, want)
		}
	}
	id, err := taskidentity.New(td, "alice/repo", "build", 11)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: 11, Pool: "linux"}, id)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := taskassignment.Encode(a)
	if err != nil {
		t.Fatal(err)
	}
	signed, err := jetstreamenv.Signer().Seal(msg)
	if err != nil {
		t.Fatal(err)
	}
	post := func(body []byte) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/", bytes.NewReader(body))
		for k, v := range map[string]string{"Content-Type": "application/json", "Ce-Specversion": "1.0", "Ce-Id": a.ID,
			"Ce-Source": "dispatch/linux", "Ce-Type": taskassignment.EventType} {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(signed); code != http.StatusAccepted {
		t.Fatalf("signed assignment: %d", code)
	}
	if code := post(msg); code != http.StatusBadRequest {
		t.Fatalf("unsigned assignment: %d", code)
	}
	fams, err := metrics.Scrape(t.Context(), srv.Client(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct{ backend, outcome string }{{"pod", "accepted"}, {"unknown", "poison"}} {
		if v, ok := fams.Value("gdr_assignments_total", "backend", want.backend, "outcome", want.outcome); !ok || v != 1 {
			t.Errorf("gdr_assignments_total{backend=%q,outcome=%q} = %v (present %v), want 1", want.backend, want.outcome, v, ok)
		}
	}
}
