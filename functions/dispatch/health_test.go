package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/health"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
)

// /healthz looks at NATS: ready while dispatch's connection is up, 503 once
// the server is gone (it used to answer 204 whatever NATS did); /livez
// stays 200, so the kubelet does not restart dispatch for NATS's outage.
func TestHealthzFollowsNATS(t *testing.T) {
	s, url := jetstreamenv.Start(t)
	nc, _ := jetstreamenv.Connect(t, url)
	ts := newTestService(t, &countingRunner{}, &countingRunner{})
	ts.svc.probes = health.Probes{Checks: []health.Check{{Name: "nats", Ready: natsconn.Connected(nc)}}}
	srv := httptest.NewServer(ts.svc.handler())
	t.Cleanup(srv.Close)
	get := func(path string) int {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz with NATS up = %d, want 200", code)
	}
	s.Shutdown()
	deadline := time.Now().Add(5 * time.Second)
	for get("/healthz") != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/healthz still not 503 5s after NATS stopped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := get("/livez"); code != http.StatusOK {
		t.Fatalf("/livez with NATS down = %d, want 200", code)
	}
}
