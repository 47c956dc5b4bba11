package dispatchmetrics

import (
	"errors"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/metricsenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

func TestDispatch(t *testing.T) {
	reg := metrics.NewRegistry()
	m := NewDispatch(reg)
	var obs dispatcher.Observer = m
	obs.Round(dispatcher.Result{Pool: "linux", InFlight: 1, Rejected: 1, KeptAlive: 2}, nil)
	obs.Queued("linux", 300*time.Millisecond)
	obs.Round(dispatcher.Result{Pool: "linux"}, errors.New("gitea down"))
	obs.Round(dispatcher.Result{Pool: "mac", InFlight: 1, Free: 3, Claimed: make([]taskassignment.Assignment, 2)}, nil)
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
		// A pool that never failed has its error counter, at 0.
		{"gdr_dispatch_claim_errors_total", []string{"pool", "mac"}, 0},
		{"gdr_dispatch_free_slots", []string{"pool", "mac"}, 1},
		{"gdr_dispatch_tasks_in_flight", []string{"pool", "mac"}, 3},
	} {
		if v, ok := metricsenv.Gather(t, reg).Value(want.name, want.labels...); !ok || v != want.v {
			t.Errorf("%s%v = %v (%v), want %v", want.name, want.labels, v, ok, want.v)
		}
	}
}
