package dispatchmetrics

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// NoPool is the pool label of a job no configured pool matches.
const NoPool = "none"

// Jobs is webhook.Observer: the times Gitea's workflow_job deliveries
// carry, the only place dispatch learns when a job was created (neither
// FetchTask's task nor its context holds it). It sees every job once per
// action (the Receiver deduplicates), so each histogram observes a job once.
//
// A job's pool is the first configured pool whose labels hold all of its
// runs-on (NoPool if none): with overlapping pools, a job is counted under
// the first, whichever claimed it.
type Jobs struct {
	pools                []runnerpool.Pool
	queueWait, toRunning *prometheus.HistogramVec
	unstarted            *prometheus.CounterVec
}

// NewJobs registers the job timing metrics of pools with reg.
func NewJobs(reg prometheus.Registerer, pools []runnerpool.Pool) *Jobs {
	m := &Jobs{pools: pools,
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metrics.Namespace, Name: "job_queue_wait_seconds",
			Help:    "From the job's creation in Gitea to its claim (a FetchTask returned it), by pool; from the workflow_job webhook's in_progress delivery.",
			Buckets: metrics.PickupBuckets}, []string{"pool"}),
		toRunning: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metrics.Namespace, Name: "job_push_to_running_seconds",
			Help:    "From the job's creation in Gitea to its first step running in its executor, by pool; observed when the job completes (workflow_job webhook).",
			Buckets: metrics.PickupBuckets}, []string{"pool"}),
		unstarted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metrics.Namespace, Name: "jobs_unstarted_total",
			Help: "Jobs Gitea ended with no step ever started, so no executor reported them (gdr_jobs_total does not count them): cancelled before they ran, failed by dispatch or recover; by pool and result (workflow_job webhook)."},
			[]string{"pool", "result"}),
	}
	reg.MustRegister(m.queueWait, m.toRunning, m.unstarted)
	// Every pool's count exists from the start, at 0, so that a query
	// over it has a series before the first such job.
	for _, p := range pools {
		for _, r := range results {
			m.unstarted.WithLabelValues(p.Name, r)
		}
	}
	return m
}

// results are the conclusions of a job Gitea reports.
var results = []string{"success", "failure", "cancelled", "skipped"}

// Delivered observes one job delivery: its queue wait when a runner picked
// it, its creation to first step (or, with none, its result) when it ended.
// Times Gitea has not set, or that run backwards, are not observed.
func (m *Jobs) Delivered(job webhook.Job) {
	pool := m.pool(job.Labels)
	switch job.Action {
	case webhook.ActionInProgress:
		if d, ok := since(job.CreatedAt, job.StartedAt); ok {
			m.queueWait.WithLabelValues(pool).Observe(d.Seconds())
		}
	case webhook.ActionCompleted:
		if job.FirstStepAt.IsZero() {
			m.unstarted.WithLabelValues(pool, resultLabel(job.Conclusion)).Inc()
		} else if d, ok := since(job.CreatedAt, job.FirstStepAt); ok {
			m.toRunning.WithLabelValues(pool).Observe(d.Seconds())
		}
	}
}

func (m *Jobs) pool(runsOn []string) string {
	for _, p := range m.pools {
		if p.Matches(runsOn) {
			return p.Name
		}
	}
	return NoPool
}

// since is to - from when both are set and to is not before from.
func since(from, to time.Time) (time.Duration, bool) {
	if from.IsZero() || to.IsZero() || to.Before(from) {
		return 0, false
	}
	return to.Sub(from), true
}

// resultLabel is a conclusion from Gitea as a label of gdr_jobs_total's
// set: success, failure, cancelled, skipped, or unknown.
func resultLabel(conclusion string) string {
	if slices.Contains(results, conclusion) {
		return conclusion
	}
	return "unknown"
}
