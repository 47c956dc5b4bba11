package main

import (
	"log/slog"
	"os"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/metricsenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor/executortest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// A once-mode pass (the CronJob recover) with GDR_METRICS_PUSH_URL pushes, as it ends, what it
// counted to the Pushgateway, in the group of job gdr-recover and its Pod (its host name): the
// pass and its result, and what it did (here nothing: every count at 0, but there).
func TestOnceModePushesThePassAtExit(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	r := &recoverer.Recoverer{
		Backends: map[taskassignment.BackendKind]executor.Backend{taskassignment.BackendProcess: executortest.NewMemory("")},
		Pools:    map[string]recoverer.Pool{"linux": {Pool: runnerpool.Pool{Name: "linux", Backend: taskassignment.BackendProcess, Capacity: 1}}},
		Payloads: env.Payloads, Queue: env.Queue, Sender: env.Queue,
	}
	pg := metricsenv.StartPushgateway(t)
	cfg := Config{PushSettings: metrics.PushSettings{PushURL: pg.URL}}
	if err := passOnce(t.Context(), cfg, r, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	pushes := pg.Pushes()
	if len(pushes) != 1 || pushes[0].Path != "/metrics/job/gdr-recover/instance/"+host {
		t.Fatalf("pushes %+v, want one to the group of job gdr-recover and instance %s", pushes, host)
	}
	fams := pushes[0].Families
	if v, ok := fams.Value("gdr_recover_passes_total", "result", "ok"); !ok || v != 1 {
		t.Errorf("pushed gdr_recover_passes_total{result=ok} = %v (present %v), want 1", v, ok)
	}
	for _, name := range []string{"gdr_recover_executors_total", "gdr_recover_payloads_total", "gdr_recover_tasks_failed_total"} {
		if fams[name] == nil {
			t.Errorf("the push lacks %s", name)
		}
	}
}
