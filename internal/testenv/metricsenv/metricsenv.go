// Package metricsenv is the tests' scrape of a Prometheus registry: served
// over HTTP by metrics.Register and read back by metrics.Scrape, as
// Prometheus reads a function's /metrics; and the tests' Pushgateway, which
// receives what a run that exits pushes (metrics.PushSettings).
package metricsenv

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

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

// Push is one push a Pushgateway received: its method, its path (the
// grouping key: /metrics/job/<job>/<label>/<value>...) and the families
// its body held.
type Push struct {
	Method, Path string
	Families     metrics.Families
}

// Pushgateway is an HTTP server of the test's own on 127.0.0.1 that answers
// pushes as a Prometheus Pushgateway does (200 to a PUT or POST under
// /metrics/job/, its body decoded in the format its Content-Type names) and
// keeps each.
type Pushgateway struct {
	URL string

	mu     sync.Mutex
	pushes []Push
}

// StartPushgateway starts a Pushgateway that lives as long as the test.
// Every push it receives whose body does not decode fails the test.
func StartPushgateway(t testing.TB) *Pushgateway {
	t.Helper()
	pg := &Pushgateway{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.Method != http.MethodPut && r.Method != http.MethodPost) || !strings.HasPrefix(r.URL.Path, "/metrics/job/") {
			http.Error(w, "not a push", http.StatusNotFound)
			return
		}
		fams := metrics.Families{}
		dec := expfmt.NewDecoder(r.Body, expfmt.ResponseFormat(r.Header))
		for {
			var f dto.MetricFamily
			if err := dec.Decode(&f); err == io.EOF {
				break
			} else if err != nil {
				t.Errorf("push to %s: %v", r.URL.Path, err)
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fams[f.GetName()] = &f
		}
		pg.mu.Lock()
		pg.pushes = append(pg.pushes, Push{Method: r.Method, Path: r.URL.EscapedPath(), Families: fams})
		pg.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	pg.URL = srv.URL
	return pg
}

// Pushes are the pushes received so far, in order.
func (pg *Pushgateway) Pushes() []Push {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	return slices.Clone(pg.pushes)
}
