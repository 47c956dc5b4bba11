package dispatchmetrics

import (
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/metricsenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// Each delivery is observed, or not, in exactly one series: which one, and
// with which value (a histogram's sum, a counter's count).
func TestJobs(t *testing.T) {
	created := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	picked, ran := created.Add(4*time.Second), created.Add(9*time.Second)
	pools := []runnerpool.Pool{
		{Name: "linux", Labels: []string{"ubuntu-latest", "linux"}},
		{Name: "big", Labels: []string{"ubuntu-latest", "linux", "big"}},
	}
	const (
		wait    = "gdr_job_queue_wait_seconds"
		running = "gdr_job_push_to_running_seconds"
		ended   = "gdr_jobs_unstarted_total"
	)
	for _, tc := range []struct {
		name   string
		job    webhook.Job
		metric string // "": nothing observed
		labels []string
		value  float64
	}{
		{"picked: creation to claim", webhook.Job{Action: "in_progress", Labels: []string{"linux"}, CreatedAt: created, StartedAt: picked},
			wait, []string{"pool", "linux"}, 4},
		{"the pool that holds all its labels", webhook.Job{Action: "in_progress", Labels: []string{"big"}, CreatedAt: created, StartedAt: picked},
			wait, []string{"pool", "big"}, 4},
		{"overlapping pools: the first", webhook.Job{Action: "in_progress", Labels: []string{"linux", "ubuntu-latest"}, CreatedAt: created, StartedAt: picked},
			wait, []string{"pool", "linux"}, 4},
		{"no pool matches", webhook.Job{Action: "in_progress", Labels: []string{"windows"}, CreatedAt: created, StartedAt: picked},
			wait, []string{"pool", NoPool}, 4},
		{"completed: creation to first step", webhook.Job{Action: "completed", Conclusion: "success", Labels: []string{"linux"},
			CreatedAt: created, StartedAt: picked, FirstStepAt: ran}, running, []string{"pool", "linux"}, 9},
		{"completed with no step: counted, by result", webhook.Job{Action: "completed", Conclusion: "cancelled", Labels: []string{"linux"},
			CreatedAt: created}, ended, []string{"pool", "linux", "result", "cancelled"}, 1},
		{"an odd conclusion", webhook.Job{Action: "completed", Conclusion: "neutral", Labels: []string{"linux"}, CreatedAt: created},
			ended, []string{"pool", "linux", "result", "unknown"}, 1},
		{"queued: nothing yet", webhook.Job{Action: "queued", Labels: []string{"linux"}, CreatedAt: created}, "", nil, 0},
		{"waiting: nothing", webhook.Job{Action: "waiting", Labels: []string{"linux"}, CreatedAt: created}, "", nil, 0},
		{"picked without a creation time", webhook.Job{Action: "in_progress", Labels: []string{"linux"}, StartedAt: picked}, "", nil, 0},
		{"a clock running backwards", webhook.Job{Action: "in_progress", Labels: []string{"linux"}, CreatedAt: picked, StartedAt: created}, "", nil, 0},
		{"first step before creation", webhook.Job{Action: "completed", Labels: []string{"linux"}, CreatedAt: ran, FirstStepAt: picked}, "", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := metrics.NewRegistry()
			var obs webhook.Observer = NewJobs(reg, pools)
			obs.Delivered(tc.job)
			fams := metricsenv.Gather(t, reg)
			for _, p := range pools {
				if _, ok := fams.Value(ended, "pool", p.Name, "result", "failure"); !ok {
					t.Errorf("%s{pool=%s,result=failure} does not exist", ended, p.Name)
				}
			}
			for _, name := range []string{wait, running, ended} {
				var n int
				var value float64
				for _, m := range fams[name].GetMetric() {
					if h := m.GetHistogram(); h != nil {
						n += int(h.GetSampleCount())
						value += h.GetSampleSum()
					} else if c := m.GetCounter(); c != nil {
						n += int(c.GetValue())
						value += c.GetValue()
					}
				}
				if name != tc.metric {
					if n != 0 {
						t.Errorf("%s observed %d times, want none", name, n)
					}
					continue
				}
				if got, ok := fams.Value(name, tc.labels...); !ok || got != 1 {
					t.Errorf("%s%v: %v observations (%v), want 1", name, tc.labels, got, ok)
				}
				if value != tc.value {
					t.Errorf("%s = %v, want %v", name, value, tc.value)
				}
			}
		})
	}
}
