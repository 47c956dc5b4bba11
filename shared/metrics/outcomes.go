package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Outcomes is handler.Observer: the outcomes of the assignment messages
// handle decided, by backend and outcome.
type Outcomes struct {
	total *prometheus.CounterVec
}

// NewOutcomes registers the assignment counter with reg.
func NewOutcomes(reg prometheus.Registerer) *Outcomes {
	m := &Outcomes{total: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "assignments_total",
		Help: "Assignment messages handled, by backend and outcome (accepted, not_yet, failed, poison, rejected); an assignment offered again counts again."},
		[]string{"backend", "outcome"})}
	reg.MustRegister(m.total)
	return m
}

// Handled counts one message. A backend that is not a known one (a message
// that did not decode) counts as "unknown".
func (m *Outcomes) Handled(backend taskassignment.BackendKind, o handler.Outcome) {
	label := "unknown"
	if b, err := taskassignment.ParseBackendKind(string(backend)); err == nil {
		label = string(b)
	}
	m.total.WithLabelValues(label, o.String()).Inc()
}
