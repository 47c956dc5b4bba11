// Package dispatchmetrics is the Prometheus instrumentation of dispatch's
// rounds (dispatcher.Observer), apart from shared/metrics so that what does
// not dispatch (handle, the gateway) does not link the dispatcher. The
// invariants of shared/metrics hold: a registry per process, nothing
// registered at init, label values from small fixed sets.
package dispatchmetrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
)

// Dispatch is dispatcher.Observer: what dispatch rounds do, per pool.
type Dispatch struct {
	rounds, claimed, claimErrors, rejected, keptAlive *prometheus.CounterVec
	inFlight, free                                    *prometheus.GaugeVec
	pickup                                            *prometheus.HistogramVec
}

// NewDispatch registers dispatch's metrics with reg.
func NewDispatch(reg prometheus.Registerer) *Dispatch {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metrics.Namespace, Subsystem: "dispatch", Name: name, Help: help}, labels)
	}
	m := &Dispatch{
		rounds:      counter("rounds_total", "Dispatch rounds, by pool and result (ok, error).", "pool", "result"),
		claimed:     counter("tasks_claimed_total", "Tasks claimed from Gitea and queued, by pool.", "pool"),
		claimErrors: counter("claim_errors_total", "Dispatch rounds that stopped on an error (Gitea, NATS or the payload store), by pool.", "pool"),
		rejected:    counter("tasks_rejected_total", "Claimed tasks that cannot run here, failed in Gitea with the reason, by pool.", "pool"),
		keptAlive:   counter("keepalives_total", "Heartbeats sent for claimed tasks that wait for their executor, by pool.", "pool"),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: metrics.Namespace, Subsystem: "dispatch", Name: "tasks_in_flight",
			Help: "Tasks of the pool claimed and not finished, as its last round counted them."}, []string{"pool"}),
		free: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: metrics.Namespace, Subsystem: "dispatch", Name: "free_slots",
			Help: "Tasks the pool may still claim after its last round: 0 while it is full."}, []string{"pool"}),
		pickup: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metrics.Namespace, Subsystem: "dispatch", Name: "pickup_seconds",
			Help: "From the claim (the FetchTask that returned the task) to its assignment published on the queue, by pool.", Buckets: metrics.PickupBuckets}, []string{"pool"}),
	}
	reg.MustRegister(m.rounds, m.claimed, m.claimErrors, m.rejected, m.keptAlive, m.inFlight, m.free, m.pickup)
	return m
}

// Round counts one round and what it did. Every per-pool series exists
// from the pool's first round on (a counter at 0 included), so that a query
// or an alert over it has a series to evaluate before the first error.
func (m *Dispatch) Round(res dispatcher.Result, err error) {
	result := "ok"
	errors := m.claimErrors.WithLabelValues(res.Pool)
	if err != nil {
		result = "error"
		errors.Inc()
	}
	m.rounds.WithLabelValues(res.Pool, result).Inc()
	m.rejected.WithLabelValues(res.Pool).Add(float64(res.Rejected))
	m.keptAlive.WithLabelValues(res.Pool).Add(float64(res.KeptAlive))
	m.inFlight.WithLabelValues(res.Pool).Set(float64(res.InFlight + len(res.Claimed)))
	m.free.WithLabelValues(res.Pool).Set(float64(max(res.Free-len(res.Claimed), 0)))
}

// Queued counts one task claimed and queued, pickup after its claim.
func (m *Dispatch) Queued(pool string, pickup time.Duration) {
	m.claimed.WithLabelValues(pool).Inc()
	m.pickup.WithLabelValues(pool).Observe(pickup.Seconds())
}
