//go:build e2e

package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
)

// BenchmarkE2EIdlePollCost measures the CPU an idle Gitea spends answering
// one runner's FetchTask polls: one real Gitea with one repository and no
// queued job, one registered runner polling sequentially at a fixed
// interval for a fixed window. Gitea's CPU time (utime+stime of its process,
// from /proc/<pid>/stat) over the window is reported as % of one core, for
// two modes:
//
//   - version: shared/gitea's Client.FetchTask, which sends back the tasks
//     version of Gitea's last empty answer, so Gitea answers from its
//     counter without looking for a job;
//   - zero: the raw Connect client sending TasksVersion 0 on every call, so
//     Gitea runs TryPickTask every time (what the client did before).
//
// The idle baseline (no polling) is measured before and after the polling
// windows; "cpu%net-…" subtracts their mean.
//
//	CI=true go test -tags e2e -run '^$' -bench E2EIdlePollCost -benchtime 1x ./functions/dispatch/
func BenchmarkE2EIdlePollCost(b *testing.B) {
	const window = 20 * time.Second
	intervals := []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second}

	g := giteaenv.Start(b, giteaenv.Options{})
	g.CreateRepo(b, "demo")
	pid := g.PID()
	ctx := context.Background()
	hc := &http.Client{Timeout: 30 * time.Second}
	creds, err := gitea.Register(ctx, g.URL, hc, gitea.Registration{
		Token: g.RegistrationToken(b), Name: "pollcost", Labels: []string{"ubuntu-latest"},
	})
	if err != nil {
		b.Fatal(err)
	}
	client, err := gitea.NewClient(g.URL, hc, creds)
	if err != nil {
		b.Fatal(err)
	}
	raw := rawRunnerClient(g.URL, hc, creds)
	// Gitea's version is at least 1 (it creates it on the first fetch), so
	// TasksVersion 0 always makes it look for a job.
	res, err := raw.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	if err != nil {
		b.Fatal(err)
	}
	if res.Msg.GetTask() != nil || res.Msg.GetTasksVersion() == 0 {
		b.Fatalf("first fetch: task %v, version %d; want no task and a version", res.Msg.GetTask(), res.Msg.GetTasksVersion())
	}
	b.Logf("gitea pid %d, tasks version %d, CLK_TCK %d, load average at start: %s", pid, res.Msg.GetTasksVersion(), clkTck(), loadavg())

	polls := map[string]func(context.Context) error{
		"version": func(ctx context.Context) error {
			t, err := client.FetchTask(ctx)
			if err == nil && t != nil {
				err = fmt.Errorf("unexpected task %d", t.GetId())
			}
			return err
		},
		"zero": func(ctx context.Context) error {
			r, err := raw.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{TasksVersion: 0}))
			if err == nil && r.Msg.GetTask() != nil {
				err = fmt.Errorf("unexpected task %d", r.Msg.GetTask().GetId())
			}
			return err
		},
	}

	time.Sleep(5 * time.Second) // let start-up work (first cron runs, queues) settle
	b.ResetTimer()
	idleBefore, idleBeforeDetail := measure(b, pid, window, 0, nil)
	type result struct {
		mode     string
		interval time.Duration
		cpu      float64
		detail   string
	}
	var results []result
	for _, iv := range intervals {
		for _, mode := range []string{"version", "zero"} {
			time.Sleep(time.Second)
			cpu, detail := measure(b, pid, window, iv, polls[mode])
			results = append(results, result{mode, iv, cpu, detail})
		}
	}
	time.Sleep(time.Second)
	idleAfter, idleAfterDetail := measure(b, pid, window, 0, nil)
	b.StopTimer()
	b.Logf("load average at end: %s; idle before: %s; idle after: %s", loadavg(), idleBeforeDetail, idleAfterDetail)
	for _, r := range results {
		b.Logf("%s-%s: %s", r.mode, durName(r.interval), r.detail)
	}

	idle := (idleBefore + idleAfter) / 2
	b.ReportMetric(idleBefore, "cpu%-idle-before")
	b.ReportMetric(idleAfter, "cpu%-idle-after")
	for _, r := range results {
		name := r.mode + "-" + durName(r.interval)
		b.ReportMetric(r.cpu, "cpu%-"+name)
		b.ReportMetric(r.cpu-idle, "cpu%net-"+name)
	}
}

// measure polls with poll every interval (none when poll is nil) for window
// and returns Gitea's CPU time over the window as % of one core, and a line
// of detail (polls made, ticks). Logged at the end: a benchmark's log is cut
// after 10 lines.
func measure(b *testing.B, pid int, window, interval time.Duration, poll func(context.Context) error) (float64, string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	calls, fails := 0, 0
	var firstErr error
	cpu0, err := procCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if poll == nil {
		<-ctx.Done()
	} else {
		tick := time.NewTicker(interval)
	loop:
		for {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			err := poll(cctx)
			ccancel()
			if ctx.Err() != nil {
				break // the window ended during the call
			}
			calls++
			if err != nil {
				fails++
				if firstErr == nil {
					firstErr = err
				}
			}
			select {
			case <-ctx.Done():
				break loop
			case <-tick.C:
			}
		}
		tick.Stop()
	}
	wall := time.Since(start)
	cpu1, err := procCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	if fails > 0 {
		b.Fatalf("%d of %d polls failed, first: %v", fails, calls, firstErr)
	}
	pct := float64(cpu1.self-cpu0.self) / float64(clkTck()) / wall.Seconds() * 100
	ticks := cpu1.self - cpu0.self
	perPoll := ""
	if calls > 0 {
		perPoll = fmt.Sprintf(", %.1f ms CPU per poll", float64(ticks)*1000/float64(clkTck())/float64(calls))
	}
	return pct, fmt.Sprintf("%d polls in %v, gitea %d ticks (+%d in waited children) = %.2f%% of a core%s",
		calls, wall.Round(time.Millisecond), ticks, cpu1.children-cpu0.children, pct, perPoll)
}

// rawRunnerClient is the runner service with the registration's headers, as
// shared/gitea sets them, but with the request left to the caller.
func rawRunnerClient(rootURL string, hc *http.Client, creds gitea.Credentials) runnerv1connect.RunnerServiceClient {
	auth := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("x-runner-uuid", creds.UUID)
			req.Header().Set("x-runner-token", string(creds.Token))
			return next(ctx, req)
		}
	})
	return runnerv1connect.NewRunnerServiceClient(hc, strings.TrimSuffix(rootURL, "/")+"/api/actions", connect.WithInterceptors(auth))
}

// statFields are the fields of /proc/<pid>/stat after the command name:
// [0] is field 3 (state), [11] utime, [12] stime, [13] cutime, [14] cstime.
func statFields(stat []byte) []string {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(stat[i+1:]))
}

type cpuTicks struct{ self, children int64 }

func procCPU(pid int) (cpuTicks, error) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuTicks{}, err
	}
	f := statFields(st)
	if len(f) < 15 {
		return cpuTicks{}, fmt.Errorf("/proc/%d/stat: %q", pid, st)
	}
	var n [4]int64
	for i := range n {
		if n[i], err = strconv.ParseInt(f[11+i], 10, 64); err != nil {
			return cpuTicks{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	return cpuTicks{self: n[0] + n[1], children: n[2] + n[3]}, nil
}

// clkTck is the kernel's clock tick rate (getconf CLK_TCK; 100 if unknown).
func clkTck() int64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 100
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func durName(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return fmt.Sprintf("%dms", d/time.Millisecond)
}
