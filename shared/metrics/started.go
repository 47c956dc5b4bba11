package metrics

import (
	"strings"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/prometheus/client_golang/prometheus"
)

// PickupBuckets are the buckets of the pickup histograms, in seconds: from
// a fast claim (tens of milliseconds) to an executor that took minutes.
var PickupBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// DurationBuckets are the buckets of the job duration histogram, in
// seconds: from a one-step job (seconds) to Gitea's 3-hour limit.
var DurationBuckets = []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 10800}

// Started is gateway.Observer: how long tasks waited for their executor,
// and how the jobs ended. The gateway is long-lived and sees every task's
// fetch and final report on every path (the KEDA path's handle and recover
// are short-lived Jobs no Prometheus scrapes), so these are counted there.
type Started struct {
	waited   *prometheus.HistogramVec
	jobs     *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewStarted registers the gateway's pickup histogram, its job counter and
// its job duration histogram with reg.
func NewStarted(reg prometheus.Registerer) *Started {
	m := &Started{
		waited: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "gateway", Name: "pickup_seconds",
			Help:    "From the claim (the task's payload stored) to its executor fetching it from the gateway, by pool: queue, executor creation and start-up.",
			Buckets: PickupBuckets}, []string{"pool"}),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "jobs_total",
			Help: "Jobs whose final result Gitea accepted from their executor, by pool and result (success, failure, cancelled, skipped); a final report retried counts again."},
			[]string{"pool", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "job_duration_seconds",
			Help:    "How long a job ran in its executor (the runner's started_at to stopped_at in its final report), by pool and result.",
			Buckets: DurationBuckets}, []string{"pool", "result"}),
	}
	reg.MustRegister(m.waited, m.jobs, m.duration)
	return m
}

// Started observes one task handed to its executor.
func (m *Started) Started(pool string, waited time.Duration) {
	m.waited.WithLabelValues(pool).Observe(waited.Seconds())
}

// Finished counts one final result and observes how long the job ran.
func (m *Started) Finished(pool string, result runnerv1.Result, ran time.Duration) {
	r := ResultLabel(result)
	m.jobs.WithLabelValues(pool, r).Inc()
	m.duration.WithLabelValues(pool, r).Observe(ran.Seconds())
}

// ResultLabel is the label value of a job result: success, failure,
// cancelled, skipped, or unknown for any other value an executor sends.
func ResultLabel(r runnerv1.Result) string {
	switch r {
	case runnerv1.Result_RESULT_SUCCESS, runnerv1.Result_RESULT_FAILURE, runnerv1.Result_RESULT_CANCELLED, runnerv1.Result_RESULT_SKIPPED:
		return strings.ToLower(strings.TrimPrefix(r.String(), "RESULT_"))
	}
	return "unknown"
}
