// Package recovermetrics is the Prometheus instrumentation of recover's
// passes, apart from shared/metrics so that what does not recover (handle,
// the gateway) does not link the recoverer package. The invariants of
// shared/metrics hold: a registry per process, nothing registered at init,
// label values from small fixed sets.
package recovermetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
)

// Recover counts recover's passes and what they did.
type Recover struct {
	passes, executors, payloads, tasksFailed *prometheus.CounterVec
}

// NewRecover registers recover's metrics with reg.
func NewRecover(reg prometheus.Registerer) *Recover {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metrics.Namespace, Subsystem: "recover", Name: name, Help: help}, labels)
	}
	m := &Recover{
		passes:      counter("passes_total", "Recover passes, by result (ok, error).", "result"),
		executors:   counter("executors_total", "Executors a pass found, by what it made of them (done, pending, failed, unknown_pool).", "outcome"),
		payloads:    counter("payloads_total", "Payloads a pass acted on (republished: neither message nor executor; deleted: task over).", "action"),
		tasksFailed: counter("tasks_failed_total", "Tasks recover failed in Gitea: from the rejection stream (rejected by handle, exhausted: out of deliveries), or vanished: the executor took the task and disappeared without a report.", "reason"),
	}
	reg.MustRegister(m.passes, m.executors, m.payloads, m.tasksFailed)
	return m
}

// Pass counts one pass with its summary and error.
func (m *Recover) Pass(sum recoverer.Summary, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.passes.WithLabelValues(result).Inc()
	for outcome, n := range map[string]int{"done": sum.Done, "pending": sum.Pending, "failed": sum.Failed, "unknown_pool": sum.UnknownPool} {
		m.executors.WithLabelValues(outcome).Add(float64(n))
	}
	m.payloads.WithLabelValues("republished").Add(float64(sum.Republished))
	m.payloads.WithLabelValues("deleted").Add(float64(sum.PayloadsDeleted))
	m.tasksFailed.WithLabelValues("rejected").Add(float64(sum.Rejected))
	m.tasksFailed.WithLabelValues("exhausted").Add(float64(sum.Exhausted))
	m.tasksFailed.WithLabelValues("vanished").Add(float64(sum.Vanished))
}
