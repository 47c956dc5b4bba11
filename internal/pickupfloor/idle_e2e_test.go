//go:build e2e

package pickupfloor

import (
	"bytes"
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
)

// BenchmarkE2EIdlePoll measures what local mode and dispatch serve cost an
// idle Gitea 1.27.3 (default queue, SQLite, no job queued) at their poll
// interval: Gitea's CPU time (utime+stime of its process, /proc/<pid>/stat)
// over a window while one process idles with one pool, as % of one core,
// and net of Gitea's own idle CPU (measured with nothing polling, before
// and after). GDR_BENCH_INTERVALS lists the intervals (default "1s"; empty
// entries mean the process's default), GDR_BENCH_WINDOW the window
// (default 30s).
//
//	CI=true go test -tags e2e -run '^$' -bench E2EIdlePoll -benchtime 1x ./internal/pickupfloor/
func BenchmarkE2EIdlePoll(b *testing.B) {
	window, err := time.ParseDuration(cmp.Or(os.Getenv("GDR_BENCH_WINDOW"), "30s"))
	if err != nil {
		b.Fatal(err)
	}
	intervals := strings.Split(cmp.Or(os.Getenv("GDR_BENCH_INTERVALS"), "1s"), ",")
	bins := buildFunctions(b)
	e := newEnv(b, "default", false, bins)
	time.Sleep(5 * time.Second) // start-up work (first cron runs, queues) settles
	var report []string
	idle := func() float64 {
		cpu, polls := measureCPU(b, e.gitea, window, nil)
		report = append(report, fmt.Sprintf("# idle: %.2f%% of a core (%s)", cpu, polls))
		return cpu
	}
	before := idle()
	type result struct {
		name string
		cpu  float64
	}
	var results []result
	for _, iv := range intervals {
		for _, path := range []string{"local", "dispatch"} {
			load := loadavg()
			var lw *logWatch
			var stop func()
			var pace []string // both read the same name
			if iv != "" {
				pace = []string{"GDR_POLL_INTERVAL=" + iv}
			}
			switch path {
			case "local":
				lw, stop = e.startFor(b, "local", bins.local, append(pace, "GDR_LOG_LEVEL=debug"),
					"--gitea-url", e.gitea.URL, "--registration-token-file", e.token, "--state-dir", b.TempDir(),
					"--gateway-addr", freeAddr(b), "--labels", "gdr-local", "--log-format", "json")
			default:
				vars := append(e.dispatchVars(b), pace...)
				lw, stop = e.startFor(b, "dispatch", bins.dispatch, vars, "serve")
				e.waitHTTP(b, "http://"+e.dispatchAddr+"/livez")
			}
			time.Sleep(3 * time.Second) // the first rounds (a Declare) are not idle polling
			cpu, polls := measureCPU(b, e.gitea, window, lw)
			stop()
			name := path + "-" + cmp.Or(iv, "default")
			results = append(results, result{name, cpu})
			report = append(report, fmt.Sprintf("# %s: %.2f%% of a core (%s); load average %s at start, %s at end", name, cpu, polls, load, loadavg()))
			time.Sleep(time.Second)
		}
	}
	after := idle()
	for _, r := range results {
		report = append(report, fmt.Sprintf("idle poll %s gross %.2f%% net %.2f%% of a core", r.name, r.cpu, r.cpu-(before+after)/2))
	}
	fmt.Println(strings.Join(report, "\n"))
}

// measureCPU returns Gitea's CPU over window as % of one core, how many
// Declare calls it logged meanwhile (it logs no FetchTask, a poll), and
// with lw how many rounds the process logged (each an idle FetchTask).
func measureCPU(b *testing.B, g *giteaenv.Server, window time.Duration, lw *logWatch) (float64, string) {
	b.Helper()
	logPath := filepath.Join(g.Dir, "gitea.log")
	off := fileSize(b, logPath)
	cpu0 := procCPU(b, g.PID())
	start := time.Now()
	time.Sleep(window)
	wall := time.Since(start)
	cpu1 := procCPU(b, g.PID())
	pct := float64(cpu1-cpu0) / float64(clkTck()) / wall.Seconds() * 100
	f, err := os.Open(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	data := make([]byte, fileSize(b, logPath)-off)
	if _, err := f.ReadAt(data, off); err != nil {
		b.Fatal(err)
	}
	detail := fmt.Sprintf("%d ticks in %v, %d Declare", cpu1-cpu0, wall.Round(time.Millisecond),
		bytes.Count(data, []byte("RunnerService/Declare")))
	if lw != nil {
		detail += fmt.Sprintf(", %d rounds", len(lw.between("dispatch round", start, start.Add(wall))))
	}
	return pct, detail
}

func fileSize(b *testing.B, path string) int64 {
	b.Helper()
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return st.Size()
}

// startFor is start for a process that the caller stops before the run
// ends: stop ends it (SIGTERM) and waits.
func (e *env) startFor(b *testing.B, name, bin string, vars []string, args ...string) (*logWatch, func()) {
	b.Helper()
	return e.startProc(b, name, bin, vars, nil, args...)
}

// dispatchVars are dispatch's variables for this env (one pool "bench",
// label gdr-dispatch), registering it first if it is not.
func (e *env) dispatchVars(b *testing.B) []string {
	b.Helper()
	pools := filepath.Join(e.dispatchState, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - name: bench\n    labels: [gdr-dispatch]\n    backend: process\n    capacity: 1000\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	vars := []string{"GDR_GITEA_URL=" + e.gitea.URL, "GDR_POOLS_FILE=" + pools, "GDR_STATE_DIR=" + e.dispatchState,
		"GDR_NATS_URL=" + e.natsURL, "GDR_TRUST_DOMAIN=" + trustDomain, "GDR_PAYLOAD_KEY=" + payloadKey,
		"GDR_ASSIGNMENT_SIGNING_KEY=" + signingKey, "GDR_WEBHOOK_SECRET=" + webhookSecret,
		"GDR_HTTP_ADDR=" + e.dispatchAddr, "GDR_LOG_LEVEL=debug"}
	if _, err := os.Stat(filepath.Join(e.dispatchState, "bench.json")); os.IsNotExist(err) {
		token, err := os.ReadFile(e.token)
		if err != nil {
			b.Fatal(err)
		}
		reg := exec.Command(e.bins.dispatch, "register")
		reg.Env = append(os.Environ(), append(vars, "GDR_REGISTRATION_TOKEN="+strings.TrimSpace(string(token)))...)
		if out, err := reg.CombinedOutput(); err != nil {
			b.Fatalf("dispatch register: %v\n%s", err, out)
		}
	}
	return vars
}

// procCPU is utime+stime of pid in clock ticks.
func procCPU(b *testing.B, pid int) int64 {
	b.Helper()
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	i := bytes.LastIndexByte(st, ')')
	f := strings.Fields(string(st[i+1:])) // [0] is field 3; [11] utime, [12] stime
	if i < 0 || len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %q", pid, st)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, st)
	}
	return u + s
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
