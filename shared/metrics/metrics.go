// Package metrics is the Prometheus instrumentation of the long-running
// components (dispatch serve, handle http mode, recover http mode, the
// gateway, local mode). Each process makes its own Registry (NewRegistry)
// and hands it to the collectors it uses; there is no global registry and
// nothing registers itself at init. The observers of dispatch's rounds and
// recover's passes are in dispatchmetrics and recovermetrics, so that this
// package links neither the dispatcher nor the recoverer package. The runs
// that exit (handle's job mode, recover's once mode) push their own
// registry to a Pushgateway as they end (PushSettings).
//
// Invariants: every label value comes from a small, fixed set (a pool or
// backend name from configuration, an outcome, an RPC method, an HTTP
// status code). No label carries a repository, a task, an assignment ID, a
// token or any other per-task or secret value.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric of the product.
const Namespace = "gdr"

// ScrapeTimeout bounds one scrape, collectors that ask NATS included.
const ScrapeTimeout = 5 * time.Second

// NewRegistry returns a process's registry, holding the Go runtime and
// process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves g's metrics in the Prometheus exposition formats.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{Timeout: ScrapeTimeout, MaxRequestsInFlight: 4})
}

// Register serves GET /metrics from g on mux.
func Register(mux *http.ServeMux, g prometheus.Gatherer) {
	mux.Handle("GET /metrics", Handler(g))
}
