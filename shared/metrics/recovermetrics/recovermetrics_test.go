package recovermetrics

import (
	"errors"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/metricsenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
)

func TestRecover(t *testing.T) {
	reg := metrics.NewRegistry()
	r := NewRecover(reg)
	r.Pass(recoverer.Summary{Executors: 3, Done: 2, Pending: 1, Republished: 1, Rejected: 1, Vanished: 2}, nil)
	r.Pass(recoverer.Summary{}, errors.New("backend down"))
	fams := metricsenv.Gather(t, reg)
	for _, want := range []struct {
		name   string
		labels []string
		v      float64
	}{
		{"gdr_recover_passes_total", []string{"result", "ok"}, 1},
		{"gdr_recover_passes_total", []string{"result", "error"}, 1},
		{"gdr_recover_executors_total", []string{"outcome", "done"}, 2},
		{"gdr_recover_payloads_total", []string{"action", "republished"}, 1},
		{"gdr_recover_tasks_failed_total", []string{"reason", "rejected"}, 1},
		{"gdr_recover_tasks_failed_total", []string{"reason", "vanished"}, 2},
	} {
		if v, ok := fams.Value(want.name, want.labels...); !ok || v != want.v {
			t.Errorf("%s%v = %v (%v), want %v", want.name, want.labels, v, ok, want.v)
		}
	}
}
