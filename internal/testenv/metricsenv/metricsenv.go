// Package metricsenv is the tests' scrape of a Prometheus registry: served
// over HTTP by metrics.Register and read back by metrics.Scrape, as
// Prometheus reads a function's /metrics.
package metricsenv

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
)

// Gather scrapes reg over HTTP, from a server on 127.0.0.1 that lives as
// long as the test.
func Gather(t testing.TB, reg prometheus.Gatherer) metrics.Families {
	t.Helper()
	mux := http.NewServeMux()
	metrics.Register(mux, reg)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	fams, err := metrics.Scrape(t.Context(), http.DefaultClient, srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return fams
}
