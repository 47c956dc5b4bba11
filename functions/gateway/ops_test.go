package main

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/health"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
)

type svidSource struct {
	svid *x509svid.SVID
	err  error
}

func (s svidSource) GetX509SVID() (*x509svid.SVID, error) { return s.svid, s.err }

func TestSVIDValid(t *testing.T) {
	now := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	id := spiffeid.RequireFromString("spiffe://ci.example.org/gateway")
	svid := func(from, to time.Time) *x509svid.SVID {
		return &x509svid.SVID{ID: id, Certificates: []*x509.Certificate{{NotBefore: from, NotAfter: to}}}
	}
	for _, tc := range []struct {
		name    string
		src     svidSource
		wantErr string
	}{
		{"valid", svidSource{svid: svid(now.Add(-time.Hour), now.Add(time.Hour))}, ""},
		{"expired", svidSource{svid: svid(now.Add(-2*time.Hour), now.Add(-time.Hour))}, "valid 2026-12-01T04:00:00Z to 2026-12-01T05:00:00Z only"},
		{"not yet valid", svidSource{svid: svid(now.Add(time.Hour), now.Add(2*time.Hour))}, "only"},
		{"none", svidSource{err: errors.New("no SVID yet")}, "no SVID yet"},
		{"no certificate", svidSource{svid: &x509svid.SVID{ID: id}}, "no certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := svidValid(tc.src, func() time.Time { return now })(context.Background())
			if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("svidValid() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// The plain-HTTP listener serves probes and metrics, and nothing of the
// runner protocol; an expired SVID makes the gateway not ready.
func TestOpsHandler(t *testing.T) {
	reg := metrics.NewRegistry()
	expired := svidSource{svid: &x509svid.SVID{ID: spiffeid.RequireFromString("spiffe://ci.example.org/gateway"),
		Certificates: []*x509.Certificate{{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}}}}
	probes := health.Probes{Checks: []health.Check{{Name: "svid", Ready: svidValid(expired, time.Now)}}}
	srv := httptest.NewServer(opsHandler(probes, reg))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/metrics", http.StatusOK},
		{http.MethodGet, "/livez", http.StatusOK},
		{http.MethodGet, "/healthz", http.StatusServiceUnavailable},
		{http.MethodPost, "/runner.v1.RunnerService/FetchTask", http.StatusNotFound},
		{http.MethodPost, "/runner.v1.RunnerService/UpdateTask", http.StatusNotFound},
		{http.MethodGet, "/", http.StatusNotFound},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s = %d, want %d", tc.method, tc.path, resp.StatusCode, tc.want)
		}
	}
}
