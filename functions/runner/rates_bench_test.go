//go:build e2e

package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/callcount"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gateway"
)

// countingForwarder counts the calls the gateway forwards to Gitea, and
// keeps the errors Gitea answered.
type countingForwarder struct {
	gateway.Forwarder
	calls *callcount.Counter
	errs  *errorLog
}

type errorLog struct {
	mu   sync.Mutex
	errs []string
}

func (l *errorLog) add(method string, err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, method+": "+err.Error())
}

func (c countingForwarder) UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	res, err := c.Forwarder.UpdateTask(ctx, req)
	c.calls.Add("UpdateTask", err != nil)
	c.errs.add(fmt.Sprintf("UpdateTask (result %s)", req.GetState().GetResult()), err)
	return res, err
}

func (c countingForwarder) UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	res, err := c.Forwarder.UpdateLog(ctx, req)
	c.calls.Add("UpdateLog", err != nil)
	c.errs.add("UpdateLog", err)
	return res, err
}

// BenchmarkE2ERunningJobCalls measures what one running job asks of Gitea
// through the gateway: the runner binary (its reporter's defaults) runs one
// real job from a real Gitea 1.27.3, and every UpdateTask and UpdateLog the
// gateway forwards is counted from the runner's start to its exit. Two jobs,
// one after the other, each one step of 30 s:
// "chatty" prints a line every second, "silent" prints nothing. It reports
// each method's calls per second of the runner's life.
//
//	CI=true go test -tags e2e -run '^$' -bench E2ERunningJobCalls -benchtime 1x -timeout 20m ./functions/runner/
func BenchmarkE2ERunningJobCalls(b *testing.B) {
	const seconds = 30
	w := newWorld(b)
	var report []string
	for _, job := range []struct{ name, script string }{
		{"chatty", fmt.Sprintf("for i in $(seq %d); do echo line $i; sleep 1; done", seconds)},
		{"silent", fmt.Sprintf("sleep %d", seconds)},
	} {
		b.Run(job.name, func(b *testing.B) {
			var (
				calls callcount.Counter
				errs  errorLog
			)
			w.steps.Forwarder = countingForwarder{Forwarder: w.steps.Forwarder, calls: &calls, errs: &errs}
			defer func() { w.steps.Forwarder = w.steps.Forwarder.(countingForwarder).Forwarder }()
			w.gitea.PushWorkflow(b, w.repo, ".gitea/workflows/ci.yml",
				fmt.Sprintf("name: ci\non: [push]\njobs:\n  %s:\n    runs-on: ubuntu-latest\n    steps:\n      - run: %s\n", job.name, job.script))
			a := w.claim(b)
			start := time.Now()
			cmd, stderr := w.start(b, a)
			if err := cmd.Wait(); err != nil {
				b.Fatalf("runner of task %d: %v\n%s", a.Task.ID, err, stderr)
			}
			life := time.Since(start)
			j := w.gitea.WaitJob(b, w.repo, func(j giteaenv.Job) bool { return j.Name == job.name && j.Status == "completed" }, 20*time.Second)
			if j.Conclusion != "success" {
				b.Fatalf("job %s ended %s", job.name, j.Conclusion)
			}
			counts := calls.Counts()
			// Gitea's refusals are counted with the rest: each cost it a call.
			failed := fmt.Sprintf("failed %v %q", calls.Failed(), errs.errs)
			var parts []string
			for _, m := range slices.Sorted(func(yield func(string) bool) {
				for k := range counts {
					if !yield(k) {
						return
					}
				}
			}) {
				rate := float64(counts[m]) / life.Seconds()
				parts = append(parts, fmt.Sprintf("%s %d (%.3f/s)", m, counts[m], rate))
				b.ReportMetric(rate, m+"/s")
			}
			total := float64(counts["UpdateTask"]+counts["UpdateLog"]) / life.Seconds()
			report = append(report, fmt.Sprintf("%s: runner life %.1f s (a %d s step); %s; both %.3f calls/s; %s; load %s",
				job.name, life.Seconds(), seconds, strings.Join(parts, ", "), total, failed, loadavg()))
		})
	}
	fmt.Println(strings.Join(report, "\n"))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
