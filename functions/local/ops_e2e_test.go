//go:build e2e

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
)

// Against a real Gitea: while a job runs, `local status` shows it started
// with its run URL; /metrics counts its claim, its assignment accepted and
// the executor's requests to the gateway; once it ended nothing is in
// flight, and after local mode stops nothing runs.
func TestE2ELocalStatusAndMetrics(t *testing.T) {
	s := newSetup(t)
	var out syncBuffer
	metricsAddr := freeAddr(t)
	local := startLocal(t, &out, append(s.args(true), "--metrics-addr", metricsAddr)...)
	s.gitea.PushWorkflow(t, s.repo, ".gitea/workflows/ci.yml", `name: ci
on: [push]
jobs:
  slow:
    runs-on: ubuntu-latest
    steps:
      - run: sleep 8
`)
	status := func() poolstatus.Report {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := runStatus([]string{"--state-dir", s.state, "-o", "json"}, &stdout, &stderr); code != 0 {
			t.Fatalf("local status exited %d: %s", code, stderr.String())
		}
		var r poolstatus.Report
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("-o json: %v\n%s", err, stdout.String())
		}
		return r
	}
	s.waitJob(t, "slow", func(j giteaenv.Job) bool { return j.Status == "in_progress" }, 60*time.Second, &out)
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := status()
		if len(r.Pools) == 1 && r.Pools[0].Started == 1 && len(r.Pools[0].Tasks) == 1 {
			task := r.Pools[0].Tasks[0]
			if task.Phase != poolstatus.PhaseStarted || task.Executor == "" || task.ExecutorPhase != "running" || !strings.HasPrefix(task.URL, strings.TrimSuffix(s.gitea.URL, "/")+"/") || !strings.Contains(task.URL, "/actions/runs/") {
				t.Fatalf("running task = %+v", task)
			}
			var table bytes.Buffer
			runStatus([]string{"--state-dir", s.state}, &table, &table)
			t.Logf("local status:\n%s", table.String())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the job started: %+v\n%s", r, out.String())
		}
		time.Sleep(300 * time.Millisecond)
	}
	s.waitJob(t, "slow", completed, 60*time.Second, &out)
	deadline = time.Now().Add(20 * time.Second)
	for r := status(); len(r.Pools) != 1 || r.Pools[0].InFlight != 0; r = status() {
		if time.Now().After(deadline) {
			t.Fatalf("status still shows tasks in flight after the job ended: %+v", r)
		}
		time.Sleep(300 * time.Millisecond)
	}
	fams, err := metrics.Scrape(t.Context(), http.DefaultClient, "http://"+metricsAddr+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		name   string
		labels []string
	}{
		{"gdr_dispatch_tasks_claimed_total", []string{"pool", "local"}},
		{"gdr_dispatch_pickup_seconds", []string{"pool", "local"}},
		{"gdr_assignments_total", []string{"backend", "process", "outcome", "accepted"}},
		{"gdr_gateway_requests_total", []string{"method", "FetchTask", "code", "200"}},
		{"gdr_gateway_pickup_seconds", []string{"pool", "local"}},
		{"gdr_gateway_requests_total", []string{"method", "UpdateTask", "code", "200"}},
	} {
		if v, ok := fams.Value(want.name, want.labels...); !ok || v < 1 {
			t.Errorf("%s%v = %v (present %v), want at least 1", want.name, want.labels, v, ok)
		}
	}
	if v, ok := fams.Value("gdr_executors", "backend", "process", "phase", "running"); !ok || v != 0 {
		t.Errorf("running executors after the job = %v (present %v), want 0", v, ok)
	}
	if v, _ := fams.Value("gdr_dispatch_tasks_claimed_total", "pool", "local"); v != 1 {
		t.Errorf("claimed = %v, want 1 (one job)", v)
	}
	if testing.Verbose() {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err == nil {
			var b strings.Builder
			_, _ = io.Copy(&b, resp.Body)
			resp.Body.Close()
			for _, line := range strings.Split(b.String(), "\n") {
				if strings.HasPrefix(line, "gdr_") && !strings.Contains(line, "_bucket{") {
					t.Log(line)
				}
			}
		}
	}
	resp, err := http.Get("http://" + metricsAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz = %d", resp.StatusCode)
	}
	if err := local.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = local.Wait()
	var stdout bytes.Buffer
	if code := runStatus([]string{"--state-dir", s.state}, &stdout, &bytes.Buffer{}); code != 0 || !strings.Contains(stdout.String(), "no local mode is running") {
		t.Fatalf("after local mode stopped: exit %d\n%s", code, stdout.String())
	}
}
