package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/health"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
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

// declareOnly is Gitea's runner service answering Declare only: what
// readiness asks of Gitea.
type declareOnly struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	calls atomic.Int64
}

func (d *declareOnly) Declare(context.Context, *connect.Request[runnerv1.DeclareRequest]) (*connect.Response[runnerv1.DeclareResponse], error) {
	d.calls.Add(1)
	return connect.NewResponse(&runnerv1.DeclareResponse{}), nil
}

// /healthz looks at Gitea (a Declare, as every round makes): ready while
// Gitea answers, 503 naming "gitea" (never the error) when it answers 5xx
// or its port is closed; a storm of probes makes one Declare per TTL.
func TestHealthzLooksAtGitea(t *testing.T) {
	gitea5xx := func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "gitea: database is locked at /var/lib/gitea", http.StatusInternalServerError)
	}
	for _, tc := range []struct {
		name     string
		handler  func(d *declareOnly) http.Handler // nil: a closed port
		wantCode int
	}{
		{"Gitea answers", func(d *declareOnly) http.Handler {
			mux := http.NewServeMux()
			path, h := runnerv1connect.NewRunnerServiceHandler(d)
			mux.Handle("/api/actions"+path, http.StripPrefix("/api/actions", h))
			return mux
		}, http.StatusOK},
		{"Gitea answers 5xx", func(*declareOnly) http.Handler { return http.HandlerFunc(gitea5xx) }, http.StatusServiceUnavailable},
		{"Gitea's port is closed", nil, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &declareOnly{}
			var giteaURL string
			if tc.handler != nil {
				g := httptest.NewServer(tc.handler(d))
				t.Cleanup(g.Close)
				giteaURL = g.URL + "/"
			} else {
				g := httptest.NewServer(http.NotFoundHandler())
				giteaURL = g.URL + "/"
				g.Close()
			}
			client, err := gitea.NewClient(giteaURL, &http.Client{Timeout: 5 * time.Second}, gitea.Credentials{UUID: "uuid", Token: "runner-token-secret"})
			if err != nil {
				t.Fatal(err)
			}
			ts := newTestService(t, &countingRunner{}, &countingRunner{})
			pool := dispatcher.Pool{Pool: runnerpool.Pool{Name: "linux", Labels: []string{"ubuntu-latest"}}, Registration: client}
			ts.svc.probes = health.Probes{Checks: []health.Check{giteaCheck(pool)}}
			srv := httptest.NewServer(ts.svc.handler())
			t.Cleanup(srv.Close)
			for i := range 20 {
				resp, err := http.Get(srv.URL + "/healthz")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.wantCode {
					t.Fatalf("probe %d: /healthz = %d %q, want %d", i, resp.StatusCode, body, tc.wantCode)
				}
				if tc.wantCode != http.StatusOK && string(body) != "not ready: gitea\n" {
					t.Fatalf("/healthz said %q, want it to name the check only", body)
				}
			}
			if tc.handler != nil && tc.wantCode == http.StatusOK && d.calls.Load() != 1 {
				t.Fatalf("20 probes made %d Declares, want 1", d.calls.Load())
			}
		})
	}
}

// Readiness declares a pool that is not paused: a paused pool's labels are declared by nobody.
func TestReadinessPoolSkipsPaused(t *testing.T) {
	linux := dispatcher.Pool{Pool: runnerpool.Pool{Name: "linux", Paused: true}}
	gpu := dispatcher.Pool{Pool: runnerpool.Pool{Name: "gpu"}}
	if got := readinessPool([]dispatcher.Pool{linux, gpu}).Name; got != "gpu" {
		t.Fatalf("readinessPool = %s, want gpu", got)
	}
	if got := readinessPool([]dispatcher.Pool{linux}).Name; got != "linux" {
		t.Fatalf("readinessPool of paused pools only = %s, want the first", got)
	}
}
