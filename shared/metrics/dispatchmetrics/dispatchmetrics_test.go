package dispatchmetrics

import (
	"errors"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/metricsenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
)

func TestDispatch(t *testing.T) {
	reg := metrics.NewRegistry()
	m := NewDispatch(reg)
	var obs dispatcher.Observer = m
	obs.Round(dispatcher.Result{Pool: "linux", InFlight: 1, Rejected: 1, KeptAlive: 2}, nil)
	obs.Queued("linux", 300*time.Millisecond)
	obs.Round(dispatcher.Result{Pool: "linux"}, errors.New("gitea down"))
	for _, want := range []struct {
		name   string
		labels []string
		v      float64
	}{
		{"gdr_dispatch_rounds_total", []string{"pool", "linux", "result", "ok"}, 1},
		{"gdr_dispatch_rounds_total", []string{"pool", "linux", "result", "error"}, 1},
		{"gdr_dispatch_claim_errors_total", []string{"pool", "linux"}, 1},
		{"gdr_dispatch_tasks_rejected_total", []string{"pool", "linux"}, 1},
		{"gdr_dispatch_keepalives_total", []string{"pool", "linux"}, 2},
		{"gdr_dispatch_tasks_claimed_total", []string{"pool", "linux"}, 1},
		{"gdr_dispatch_pickup_seconds", []string{"pool", "linux"}, 1},
	} {
		if v, ok := metricsenv.Gather(t, reg).Value(want.name, want.labels...); !ok || v != want.v {
			t.Errorf("%s%v = %v (%v), want %v", want.name, want.labels, v, ok, want.v)
		}
	}
}
