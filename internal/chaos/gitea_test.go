//go:build chaosgitea

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
)

// giteaSettings are TestChaosGitea's, from CHAOS_GITEA_* variables.
type giteaSettings struct {
	Jobs, Kills, GiteaKills, Capacity int
	// Drain bounds the wait, after the last kill, for every job to end and
	// every executor to be cleaned up.
	Drain time.Duration
	Seed  uint64
}

func loadGiteaSettings(t *testing.T) giteaSettings {
	s := giteaSettings{Jobs: 100, Kills: 30, GiteaKills: 2, Capacity: 4, Drain: 10 * time.Minute, Seed: uint64(time.Now().UnixNano())}
	for k, p := range map[string]*int{"CHAOS_GITEA_JOBS": &s.Jobs, "CHAOS_GITEA_KILLS": &s.Kills,
		"CHAOS_GITEA_RESTARTS": &s.GiteaKills, "CHAOS_GITEA_CAPACITY": &s.Capacity} {
		if v := os.Getenv(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a count", k, v)
			}
			*p = n
		}
	}
	if s.Capacity < 1 || s.Jobs < 1 {
		t.Fatalf("CHAOS_GITEA_JOBS %d, CHAOS_GITEA_CAPACITY %d: want at least 1 each", s.Jobs, s.Capacity)
	}
	if v := os.Getenv("CHAOS_GITEA_DRAIN"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CHAOS_GITEA_DRAIN=%q: %v", v, err)
		}
		s.Drain = d
	}
	if v := os.Getenv("CHAOS_GITEA_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_GITEA_SEED=%q: %v", v, err)
		}
		s.Seed = n
	}
	return s
}

// jobsPerPush is how many jobs each push's workflow has (one matrix).
const jobsPerPush = 10

// localMode is local mode run as the real binary, one process ("life") at a
// time on one state directory and one gateway address.
type localMode struct {
	bin, logs string
	args      []string
	env       []string
	mu        sync.Mutex
	proc      *testenv.Process
	lives     int
	// starts are when each life started, in order.
	starts []time.Time
}

// start starts the next life; its output goes to logs/local-<life>.log.
func (l *localMode) start(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lives++
	out, err := os.Create(filepath.Join(l.logs, fmt.Sprintf("local-%d.log", l.lives)))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(l.bin, l.args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = l.env, out, out
	p, err := testenv.StartProcess(cmd)
	if err != nil {
		t.Fatal(err)
	}
	l.proc = p
	l.starts = append(l.starts, time.Now())
}

// kill SIGKILLs local mode's process alone (not its group: the executors
// are groups of their own anyway) and returns once it is reaped, with how
// it ended.
func (l *localMode) kill() (int, error) {
	l.mu.Lock()
	p := l.proc
	l.mu.Unlock()
	pid := p.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return pid, fmt.Errorf("SIGKILL local pid %d: %w", pid, err)
	}
	select {
	case <-p.Exited():
	case <-time.After(10 * time.Second):
		return pid, fmt.Errorf("local pid %d still runs 10 s after SIGKILL", pid)
	}
	if syscall.Kill(pid, 0) == nil {
		return pid, fmt.Errorf("local pid %d exists after it was reaped", pid)
	}
	return pid, nil
}

// exited reports whether the current life ended by itself.
func (l *localMode) exited() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.proc.Exited():
		return true
	default:
		return false
	}
}

func (l *localMode) stop() {
	l.mu.Lock()
	p := l.proc
	l.mu.Unlock()
	if p != nil {
		p.Stop(2 * time.Minute)
	}
}

// received is the IDs of the tasks any life of local mode received from
// Gitea: its "job picked up" lines (--log-format json), written as the
// FetchTask answer arrives.
func (l *localMode) received(t *testing.T) map[int64]bool {
	t.Helper()
	ids := map[int64]bool{}
	for i := 1; i <= l.lives; i++ {
		data, err := os.ReadFile(filepath.Join(l.logs, fmt.Sprintf("local-%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(data)) {
			var e struct {
				Msg  string `json:"msg"`
				Task int64  `json:"task"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "job picked up" && e.Task > 0 {
				ids[e.Task] = true
			}
		}
	}
	return ids
}

// tail is the end of every life's log, for a failure message.
func (l *localMode) tail(lines int) string {
	var b strings.Builder
	for i := max(1, l.lives-2); i <= l.lives; i++ {
		fmt.Fprintf(&b, "== local-%d.log\n%s\n", i, testenv.LogTail(filepath.Join(l.logs, fmt.Sprintf("local-%d.log", i)), lines))
	}
	return b.String()
}

// executorProc is an executor's process as the process backend recorded it
// (executor.json): its PID and start time.
type executorProc struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// executorWatch records every executor process the backend ever recorded
// under dir (polled), so that none can outlive the drain unseen.
type executorWatch struct {
	dir  string
	mu   sync.Mutex
	seen map[string]executorProc
}

func (w *executorWatch) poll() {
	metas, _ := filepath.Glob(filepath.Join(w.dir, "*", "executor.json"))
	for _, m := range metas {
		data, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var p executorProc
		if json.Unmarshal(data, &p) != nil || p.PID == 0 {
			continue
		}
		w.mu.Lock()
		w.seen[filepath.Base(filepath.Dir(m))] = p
		w.mu.Unlock()
	}
}

// running returns the executors whose runner is alive now (recorded, no
// status file yet, its process the one recorded), by ID: the assignment's,
// one per job (one task per job, none re-run).
func (w *executorWatch) running() []string {
	w.poll()
	var ids []string
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, p := range w.seen {
		if _, err := os.Stat(filepath.Join(w.dir, id, "status")); err == nil {
			continue
		}
		if startOf(p.PID) == p.Start {
			ids = append(ids, id)
		}
	}
	return ids
}

// startOf is a process's start time (/proc/<pid>/stat field 22), 0 if it
// does not exist.
func startOf(pid int) uint64 {
	f := procStat(pid)
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

// procStat is /proc/<pid>/stat's fields after the command (field 3 on).
func procStat(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// leftovers are what the backend left after the drain: every executor
// directory, and every live process that is a recorded executor or in its
// process group (the runner's steps: the runner leads its own group).
func (w *executorWatch) leftovers() []string {
	var out []string
	entries, _ := os.ReadDir(w.dir)
	for _, e := range entries {
		var files []string
		_ = filepath.WalkDir(filepath.Join(w.dir, e.Name()), func(path string, _ os.DirEntry, _ error) error {
			if rel, err := filepath.Rel(w.dir, path); err == nil && len(files) < 10 {
				files = append(files, rel)
			}
			return nil
		})
		out = append(out, fmt.Sprintf("executor %s: its state directory %s (%s)", e.Name(), filepath.Join(w.dir, e.Name()), strings.Join(files, " ")))
	}
	w.mu.Lock()
	groups := map[int]string{}
	for id, p := range w.seen {
		if startOf(p.PID) == p.Start {
			out = append(out, fmt.Sprintf("executor %s: its runner (pid %d) runs", id, p.PID))
		}
		groups[p.PID] = id
	}
	w.mu.Unlock()
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		f := procStat(pid)
		if len(f) < 3 || f[0] == "Z" {
			continue
		}
		pgrp, _ := strconv.Atoi(f[2])
		if id, ok := groups[pgrp]; ok && pgrp != pid {
			out = append(out, fmt.Sprintf("executor %s: pid %d of its process group runs", id, pid))
		}
	}
	return out
}

// TestChaosGitea is the chaos run against the real Gitea (issue 31, `make
// chaos-gitea`): Jobs jobs of a real workflow (ChaosGiteaWorkflow: each
// job's result is the one its last step earns) on Gitea 1.27.3, run by the
// real local mode binary (embedded NATS, process backend, gateway, the
// real runner in host mode); Kills SIGKILLs of local mode at seeded random
// moments, each while at least one job runs and each followed by a restart
// on the same state directory; GiteaKills SIGKILLs of Gitea (its process
// group) while jobs run, each restarted after a seeded pause. Judged by
// JudgeGitea from Gitea's API (each job's status, conclusion, step
// conclusions, its log's mark) and from the backend after the drain (no
// executor directory, no executor process). It prints the one line
// GiteaTally.Line and fails unless lost, wrongly-failed and leaked are 0.
func TestChaosGitea(t *testing.T) {
	s := loadGiteaSettings(t)
	fmt.Printf("chaos-gitea: seed %d (CHAOS_GITEA_SEED), %d jobs, %d kills of local mode, %d of Gitea, capacity %d\n",
		s.Seed, s.Jobs, s.Kills, s.GiteaKills, s.Capacity)
	began := time.Now()
	r := mathrand.New(mathrand.NewPCG(s.Seed, 31))

	bin := filepath.Join(t.TempDir(), "local")
	if out, err := exec.Command("go", "build", "-o", bin, module+"/functions/local").CombinedOutput(); err != nil {
		t.Fatalf("go build local: %v\n%s", err, out)
	}
	// A claim cut by a SIGKILL (cutClaimGitea) ends as a zombie: reaped
	// after 2 min, not Gitea's 10 (a healthy job's runner reports every 5 s,
	// and local mode or Gitea is down for seconds at most).
	g := giteaenv.Start(t, giteaenv.Options{ZombieTaskTimeout: 2 * time.Minute, ZombieSchedule: "@every 5s"})
	repo := g.CreateRepo(t, "chaos")
	work := t.TempDir()
	if d := os.Getenv("CHAOS_GITEA_DIR"); d != "" { // kept after the run
		work = d
	}
	token := filepath.Join(work, "registration-token")
	if err := os.WriteFile(token, []byte(g.RegistrationToken(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state, logs := filepath.Join(work, "state"), filepath.Join(work, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	gw := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
	lm := &localMode{bin: bin, logs: logs,
		args: []string{"--gitea-url", g.URL, "--state-dir", state, "--gateway-addr", gw, "--capacity", strconv.Itoa(s.Capacity), "--log-format", "json"},
		env:  append(os.Environ(), "GDR_POLL_INTERVAL=500ms", "GDR_RECOVER_INTERVAL=5s")}
	t.Cleanup(lm.stop)
	defer func() {
		if t.Failed() {
			t.Logf("local mode's logs (%s):\n%s", logs, lm.tail(40))
		}
	}()

	watch := &executorWatch{dir: filepath.Join(state, "executors"), seen: map[string]executorProc{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for sleep(ctx, 100*time.Millisecond) {
			watch.poll()
		}
	}()

	// The jobs: about one in three fails by its last step.
	for round, first := 0, 0; first < s.Jobs; round, first = round+1, first+jobsPerPush {
		codes := make([]int, min(jobsPerPush, s.Jobs-first))
		for i := range codes {
			if r.IntN(3) == 0 {
				codes[i] = 1 + r.IntN(3)
			}
		}
		g.PushWorkflow(t, repo, ".gitea/workflows/chaos.yml", ChaosGiteaWorkflow(round, first, codes, 5))
		// The next push waits for this one's jobs: Gitea 1.27.3 may read
		// the workflow of a push whose event it handles late from the
		// branch's newer head (seen: one round's jobs twice, the one
		// before never).
		deadline := time.Now().Add(time.Minute)
		for n := len(g.Jobs(t, repo)); n < first+len(codes); n = len(g.Jobs(t, repo)) {
			if time.Now().After(deadline) {
				t.Fatalf("Gitea holds %d jobs a minute after push %d, want %d", n, round+1, first+len(codes))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t.Logf("%d jobs queued in Gitea %s after the start", s.Jobs, time.Since(began).Round(time.Second))

	// Local mode starts once every job is queued, so that the kills land
	// among all of them. The first life registers with the token; later ones
	// use the credentials it saved in the state directory.
	lm.args = append(lm.args, "--registration-token-file", token)
	lm.start(t)
	lm.args = lm.args[:len(lm.args)-2]

	// The faults. Each waits for a job to run, so that it lands mid-job.
	midJob := func(what string) []string {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			if ids := watch.running(); len(ids) > 0 {
				return ids
			}
			if lm.exited() {
				t.Fatalf("local mode exited by itself before %s:\n%s", what, lm.tail(40))
			}
			if time.Now().After(deadline) {
				t.Fatalf("no job ran for 3 min before %s (%d jobs done?)", what, len(g.Jobs(t, repo)))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	giteaAfter := map[int]bool{}
	for len(giteaAfter) < min(s.GiteaKills, s.Kills) {
		giteaAfter[r.IntN(s.Kills)] = true
	}
	kills, giteaKills := 0, 0
	inFlight := map[string]bool{} // the jobs running at any kill
	var localKilled, giteaKilled []time.Time
	for k := range s.Kills {
		sleep(ctx, time.Second/2+time.Duration(r.Int64N(int64(3*time.Second))))
		running := midJob(fmt.Sprintf("kill %d", k+1))
		pid, err := lm.kill()
		if err != nil {
			t.Fatal(err)
		}
		localKilled = append(localKilled, time.Now())
		kills++
		for _, id := range running {
			inFlight[id] = true
		}
		t.Logf("kill %d: local pid %d SIGKILLed with %d jobs running", kills, pid, len(running))
		sleep(ctx, time.Duration(r.Int64N(int64(time.Second))))
		lm.start(t)
		if giteaAfter[k] {
			sleep(ctx, time.Second+time.Duration(r.Int64N(int64(2*time.Second))))
			running := midJob(fmt.Sprintf("Gitea's kill %d", giteaKills+1))
			killGitea(t, g)
			giteaKilled = append(giteaKilled, time.Now())
			giteaKills++
			down := time.Second + time.Duration(r.Int64N(int64(3*time.Second)))
			t.Logf("Gitea kill %d: SIGKILLed with %d jobs running, down for %s", giteaKills, len(running), down.Round(time.Millisecond))
			sleep(ctx, down)
			g.Restart(t)
		}
	}
	for range s.GiteaKills - giteaKills { // more Gitea kills than local ones asked for
		midJob("a kill of Gitea")
		killGitea(t, g)
		giteaKilled = append(giteaKilled, time.Now())
		giteaKills++
		g.Restart(t)
	}
	t.Logf("faults done %s after the start: %d kills of local mode (%d distinct jobs running at them), %d of Gitea",
		time.Since(began).Round(time.Second), kills, len(inFlight), giteaKills)

	// The drain: every job ends, every executor is cleaned up.
	deadline := time.Now().Add(s.Drain)
	for {
		jobs := g.Jobs(t, repo)
		done := 0
		for _, j := range jobs {
			if j.Status == "completed" {
				done++
			}
		}
		left, _ := os.ReadDir(watch.dir)
		if done == len(jobs) && len(left) == 0 && len(watch.running()) == 0 {
			break
		}
		if lm.exited() {
			t.Fatalf("local mode exited by itself during the drain:\n%s", lm.tail(40))
		}
		if time.Now().After(deadline) {
			t.Logf("drain not done after %s: %d of %d jobs completed, %d executors left", s.Drain, done, len(jobs), len(left))
			break
		}
		time.Sleep(time.Second)
	}
	lm.stop()
	time.Sleep(time.Second) // the last runners' process groups, if any, are reaped

	var records []GiteaJobRecord
	jobs, tasks := g.Jobs(t, repo), giteaTasks(t, g, repo)
	names := map[string]int{}
	for _, j := range jobs {
		names[j.Name]++
	}
	for _, j := range jobs {
		rec := GiteaJobRecord{ID: j.ID, Name: j.Name, Status: j.Status, Conclusion: j.Conclusion, Attempt: j.RunAttempt, Started: j.StartedAt}
		if ids := tasks[j.Name]; len(ids) == 1 && names[j.Name] == 1 {
			rec.TaskID = ids[0]
		}
		for _, st := range j.Steps {
			rec.Steps = append(rec.Steps, st.Conclusion)
		}
		if n, _, ok := Earned(j.Name); ok && j.Status == "completed" {
			logs, ok := g.JobLogsIfAny(t, repo, j.ID)
			rec.Marks, rec.HasLog = strings.Count(logs, MarkOf(n)), ok
		}
		records = append(records, rec)
	}
	received := lm.received(t)
	ev := CutEvidence{Received: received, GiteaKills: giteaKilled}
	for i, start := range lm.starts {
		l := LocalLife{Started: start}
		if i < len(localKilled) { // kill i ended life i; the last life was stopped
			l.Killed = localKilled[i]
		}
		ev.Lives = append(ev.Lives, l)
	}
	var unreceived []int64
	ntasks := 0
	for _, ids := range tasks {
		ntasks += len(ids)
		for _, id := range ids {
			if !received[id] {
				unreceived = append(unreceived, id)
			}
		}
	}
	slices.Sort(unreceived)
	known := 0
	for _, rec := range records {
		if rec.TaskID != 0 {
			known++
		}
	}
	t.Logf("%d tasks created by Gitea (%d of %d jobs' known), %d received by local mode; never received: %v",
		ntasks, known, len(records), len(received), unreceived)
	tally := JudgeGitea(s.Jobs, records, ev, watch.leftovers())
	for _, l := range tally.Lines {
		t.Log(l)
	}
	t.Logf("wall time %s, seed %d; %d lives of local mode", time.Since(began).Round(time.Second), s.Seed, lm.lives)
	fmt.Println(tally.CutLine())
	fmt.Println(tally.Line(kills, giteaKills))
	if kills < s.Kills || giteaKills < s.GiteaKills {
		t.Errorf("%d kills and %d Gitea kills happened, want %d and %d", kills, giteaKills, s.Kills, s.GiteaKills)
	}
	if tally.Lost+tally.Wrong+tally.Leaked > 0 {
		t.Errorf("the verdict failed the run (seed %d)", s.Seed)
	}
}

// giteaTasks returns the IDs of the tasks Gitea created in repo, by the name
// of their job (its API lists tasks with their job's name, not its ID).
func giteaTasks(t *testing.T, g *giteaenv.Server, repo string) map[string][]int64 {
	t.Helper()
	byName := map[string][]int64{}
	for page, seen := 1, 0; ; page++ {
		var r struct {
			Tasks []struct {
				ID   int64  `json:"id"`
				Name string `json:"name"`
			} `json:"workflow_runs"` // sic: Gitea's ActionTaskResponse
			TotalCount int `json:"total_count"`
		}
		if code := g.Do(t, http.MethodGet, fmt.Sprintf("/repos/%s/actions/tasks?page=%d&limit=50", repo, page), nil, &r); code != http.StatusOK {
			t.Fatalf("list the tasks of %s: status %d", repo, code)
		}
		for _, task := range r.Tasks {
			byName[task.Name] = append(byName[task.Name], task.ID)
		}
		if seen += len(r.Tasks); len(r.Tasks) == 0 || seen >= r.TotalCount {
			return byName
		}
	}
}

// killGitea SIGKILLs Gitea's whole process group (giteaenv starts it as a
// group's leader) and returns once its process is gone; Restart then starts
// it again on the same data and port.
func killGitea(t *testing.T, g *giteaenv.Server) {
	t.Helper()
	pid := g.PID()
	if pid == 0 {
		t.Fatal("Gitea is not running")
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL Gitea's group %d: %v", pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		if time.Now().After(deadline) {
			t.Fatalf("Gitea pid %d still exists 10 s after SIGKILL", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := http.Client{Timeout: 2 * time.Second}
	if resp, err := c.Get(g.URL + "api/healthz"); err == nil {
		resp.Body.Close()
		t.Fatalf("Gitea answered %d after its SIGKILL", resp.StatusCode)
	}
}
