package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// PickupBuckets are the buckets of the pickup histograms, in seconds: from
// a fast claim (tens of milliseconds) to an executor that took minutes.
var PickupBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// Started is gateway.Observer: how long tasks waited for their executor.
type Started struct {
	waited *prometheus.HistogramVec
}

// NewStarted registers the gateway's pickup histogram with reg.
func NewStarted(reg prometheus.Registerer) *Started {
	m := &Started{waited: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "gateway", Name: "pickup_seconds",
		Help:    "From the claim (the task's payload stored) to its executor fetching it from the gateway, by pool: queue, executor creation and start-up.",
		Buckets: PickupBuckets}, []string{"pool"})}
	reg.MustRegister(m.waited)
	return m
}

// Started observes one task handed to its executor.
func (m *Started) Started(pool string, waited time.Duration) {
	m.waited.WithLabelValues(pool).Observe(waited.Seconds())
}
