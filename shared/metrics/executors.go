package metrics

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// ExecutorLister is what Executors reads of a backend on every scrape:
// its executors' assignments, then each one's executor (two methods of
// executor.Backend). A scrape costs one list and one find per
// executor: cheap for the process backend, an API call each for the
// others.
type ExecutorLister interface {
	RecoverAssignments(ctx context.Context) ([]taskassignment.Assignment, error)
	Find(ctx context.Context, assignmentID string) (*executor.Executor, error)
}

// Executors is a collector of the executors each backend holds, by phase,
// read on scrape.
type Executors struct {
	backends map[taskassignment.BackendKind]ExecutorLister
	log      *slog.Logger
	count    *prometheus.Desc
}

// NewExecutors returns the collector of backends; register it with a
// Registry.
func NewExecutors(backends map[taskassignment.BackendKind]ExecutorLister, log *slog.Logger) *Executors {
	return &Executors{backends: backends, log: log,
		count: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "executors"),
			"Executors the backend holds, by phase (pending, running, succeeded, failed, unknown), read at this scrape.",
			[]string{"backend", "phase"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *Executors) Describe(ch chan<- *prometheus.Desc) { ch <- c.count }

// Collect implements prometheus.Collector. A backend that cannot be listed
// is left out of this scrape (logged at debug level).
func (c *Executors) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), ScrapeTimeout)
	defer cancel()
	phases := []executor.Phase{executor.PhasePending, executor.PhaseRunning, executor.PhaseSucceeded, executor.PhaseFailed, executor.PhaseUnknown}
	for b, l := range c.backends {
		as, err := l.RecoverAssignments(ctx)
		if err != nil {
			if c.log != nil {
				c.log.Debug("executors unreadable for metrics", slog.String("backend", string(b)), slog.Any("error", err))
			}
			continue
		}
		n := map[executor.Phase]int{}
		for _, a := range as {
			e, err := l.Find(ctx, a.ID)
			if err != nil || e == nil {
				continue // gone since the list, or unreadable: the next scrape tells
			}
			p := e.Phase
			if p != executor.PhasePending && p != executor.PhaseRunning && !p.Terminal() {
				p = executor.PhaseUnknown
			}
			n[p]++
		}
		for _, p := range phases {
			ch <- prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(n[p]), string(b), string(p))
		}
	}
}
