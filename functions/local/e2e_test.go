//go:build e2e

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// localBinary builds local mode once per test binary; GDR_E2E_LOCAL_BINARY
// names another build to test instead (an older commit's, to see a test
// fail on the code before a fix).
func localBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("GDR_E2E_LOCAL_BINARY"); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gdr-local-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "local")
		if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// instance is one local mode process.
type instance struct {
	cmd    *exec.Cmd
	output *bytes.Buffer
	done   chan struct{}
}

// syncBuffer is a concurrency-safe output sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startBench starts local mode for a benchmark; the caller kills it.
func startBench(b *testing.B, bin string, args ...string) *exec.Cmd {
	b.Helper()
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd
}

// startLocal starts local mode with args and returns it; it is killed (by
// PID) when the test ends. The test's environment (t.Setenv) overrides the
// short intervals it sets.
func startLocal(t *testing.T, out *syncBuffer, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(localBinary(t), args...)
	cmd.Env = append([]string{"GDR_POLL_INTERVAL=500ms", "GDR_RECOVER_INTERVAL=2s", "GDR_LOG_LEVEL=debug"}, os.Environ()...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	})
	return cmd
}

type setup struct {
	gitea   *giteaenv.Server
	repo    string
	token   string // the path of a file holding the registration token
	state   string
	gateway string
}

func newSetup(t *testing.T) setup {
	t.Helper()
	g := giteaenv.Start(t, giteaenv.Options{ChannelQueue: true})
	return setup{gitea: g, repo: g.CreateRepo(t, "demo"), token: tokenFile(t, g.RegistrationToken(t)),
		state: filepath.Join(t.TempDir(), "state"), gateway: freeAddr(t)}
}

// tokenFile writes a registration token to a file of the test's, for
// --registration-token-file: a token never goes on a command line.
func tokenFile(t testing.TB, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "registration-token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (s setup) args(withToken bool) []string {
	a := []string{"--gitea-url", s.gitea.URL, "--state-dir", s.state, "--gateway-addr", s.gateway, "--capacity", "3"}
	if withToken {
		a = append(a, "--registration-token-file", s.token)
	}
	return a
}

// keepRunnerLogs copies each executor's runner.log while it exists (recover
// deletes it with the executor), for failure messages.
func (s setup) keepRunnerLogs(t *testing.T) *syncBuffer {
	t.Helper()
	logs := &syncBuffer{}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	seen := map[string]string{}
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond): // an executor's folder goes when its job ends: a job of a second can slip between slower polls
			}
			paths, _ := filepath.Glob(filepath.Join(s.state, "executors", "*", "runner.log"))
			for _, p := range paths {
				if data, err := os.ReadFile(p); err == nil && len(data) > len(seen[p]) {
					fmt.Fprintf(logs, "== %s\n%s\n", p, data[len(seen[p]):])
					seen[p] = string(data)
				}
			}
		}
	}()
	return logs
}

func (s setup) waitJob(t *testing.T, name string, pred func(giteaenv.Job) bool, timeout time.Duration, out *syncBuffer) giteaenv.Job {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, j := range s.gitea.Jobs(t, s.repo) {
			if j.Name == name && pred(j) {
				return j
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s never reached the state; jobs %+v\nlocal mode said:\n%s", name, s.gitea.Jobs(t, s.repo), out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitNoExecutors waits until local mode has no executor left.
func (s setup) waitNoExecutors(t *testing.T, timeout time.Duration, out *syncBuffer) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		entries, _ := os.ReadDir(filepath.Join(s.state, "executors"))
		if len(entries) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("executors left behind: %d\n%s", len(entries), out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func completed(j giteaenv.Job) bool { return j.Status == "completed" }

func TestE2ELocalRunsSucceedingFailingAndCancelledJobs(t *testing.T) {
	s := newSetup(t)
	var out syncBuffer
	runners := s.keepRunnerLogs(t)
	defer func() {
		if t.Failed() {
			t.Logf("runner logs:\n%s", runners)
		}
	}()
	startLocal(t, &out, s.args(true)...)
	s.gitea.PushWorkflow(t, s.repo, ".gitea/workflows/ci.yml", `name: ci
on: [push]
jobs:
  ok:
    runs-on: ubuntu-latest
    steps:
      - run: echo all good
  broken:
    runs-on: ubuntu-latest
    steps:
      - run: echo about to fail
      - run: exit 7
  slow:
    runs-on: ubuntu-latest
    steps:
      - run: sleep 300
`)
	ok := s.waitJob(t, "ok", completed, 60*time.Second, &out)
	if ok.Conclusion != "success" || len(ok.Steps) != 1 || ok.Steps[0].Conclusion != "success" {
		t.Fatalf("ok = %+v", ok)
	}
	if logs := s.gitea.JobLogs(t, s.repo, ok.ID); !strings.Contains(logs, "all good") {
		t.Fatalf("ok's log:\n%s", logs)
	}
	broken := s.waitJob(t, "broken", completed, 60*time.Second, &out)
	if broken.Conclusion != "failure" || len(broken.Steps) != 2 || broken.Steps[0].Conclusion != "success" || broken.Steps[1].Conclusion != "failure" {
		t.Fatalf("broken = %+v", broken)
	}
	slow := s.waitJob(t, "slow", func(j giteaenv.Job) bool {
		return j.Status == "in_progress" && len(j.Steps) == 1 && j.Steps[0].Status == "in_progress"
	}, 60*time.Second, &out)
	s.gitea.CancelRun(t, s.repo, slow.RunID)
	slow = s.waitJob(t, "slow", completed, 60*time.Second, &out)
	if slow.Conclusion != "cancelled" {
		t.Fatalf("slow = %+v", slow)
	}
	// Each executor is cleaned up as it ends (recover would too).
	s.waitNoExecutors(t, 20*time.Second, &out)
	// One line per job event, as act_runner users are used to.
	for _, j := range []giteaenv.Job{ok, broken, slow} {
		s.checkJobEvents(t, out.String(), "text", j.Name, j.Conclusion)
	}
	// Each runner's log is in one format, the runner's JSON lines (act's
	// and the reporter's logrus lines among them).
	lines := 0
	for _, line := range strings.Split(runners.String(), "\n") {
		if line == "" || strings.HasPrefix(line, "== ") {
			continue
		}
		lines++
		if !json.Valid([]byte(line)) {
			t.Errorf("a runner's log line is not the runner's JSON: %q", line)
		}
	}
	if lines == 0 {
		t.Error("no runner's log was read")
	}
}

// checkJobEvents checks that local mode's output says, in format, that job
// was picked up, ran in an executor and finished with result, with the
// job's run URL; it logs the lines when the test is verbose.
func (s setup) checkJobEvents(t *testing.T, output, format, job, result string) {
	t.Helper()
	type event struct {
		Msg, Job, Repository, URL, Executor, Result, Duration string
	}
	var events []event
	for _, line := range strings.Split(output, "\n") {
		var e event
		switch format {
		case "json":
			if strings.TrimSpace(line) == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("with --log-format json, a line is not JSON: %q: %v", line, err)
			}
			str := func(k string) string { v, _ := m[k].(string); return v }
			e = event{Msg: str("msg"), Job: str("job"), Repository: str("repository"), URL: str("url"), Executor: str("executor"), Result: str("result"), Duration: str("duration")}
		default:
			if !strings.Contains(line, "msg=\"job ") {
				continue
			}
			r := slogText(line)
			e = event{Msg: r["msg"], Job: r["job"], Repository: r["repository"], URL: r["url"], Executor: r["executor"], Result: r["result"], Duration: r["duration"]}
		}
		if e.Job == job && strings.HasPrefix(e.Msg, "job ") {
			events = append(events, e)
			if testing.Verbose() {
				t.Logf("%s", line)
			}
		}
	}
	runs := strings.TrimSuffix(s.gitea.URL, "/") + "/" + s.repo + "/actions/runs/"
	if len(events) != 3 {
		t.Fatalf("job %s: want 3 event lines (picked up, running, finished), got %+v\n%s", job, events, output)
	}
	if e := events[0]; e.Msg != msgPickedUp || e.Repository != s.repo || !strings.HasPrefix(e.URL, runs) {
		t.Errorf("job %s picked up: %+v, want repository %s and URL under %s", job, e, s.repo, runs)
	}
	if e := events[1]; e.Msg != msgRunning || e.Executor == "" {
		t.Errorf("job %s running: %+v", job, e)
	}
	if e := events[2]; e.Msg != msgFinished || e.Result != result || e.URL != events[0].URL || e.Duration == "" {
		t.Errorf("job %s finished: %+v, want result %s and URL %s", job, e, result, events[0].URL)
	}
}

// TestE2ELocalFreesAFinishedJobsSlotAtOnce runs two jobs at capacity 1 with
// recover's periodic pass out of the way (10m): the second job gets the
// first one's slot only because the first is finished as its executor
// process ends, not on recover's next tick. It logs in JSON: each job's
// event lines parse.
func TestE2ELocalFreesAFinishedJobsSlotAtOnce(t *testing.T) {
	t.Setenv("GDR_RECOVER_INTERVAL", "10m")
	t.Setenv("GDR_LOG_LEVEL", "info")
	s := newSetup(t)
	var out syncBuffer
	startLocal(t, &out, append(s.args(true), "--capacity", "1", "--log-format", "json")...)
	started := time.Now()
	s.gitea.PushWorkflow(t, s.repo, ".gitea/workflows/ci.yml", `name: ci
on: [push]
jobs:
  first:
    runs-on: ubuntu-latest
    steps:
      - run: echo one
  second:
    runs-on: ubuntu-latest
    steps:
      - run: echo two
`)
	for _, name := range []string{"first", "second"} {
		if j := s.waitJob(t, name, completed, 60*time.Second-time.Since(started), &out); j.Conclusion != "success" {
			t.Fatalf("%s = %+v", name, j)
		}
	}
	t.Logf("both jobs done %v after the push", time.Since(started).Round(time.Millisecond))
	s.waitNoExecutors(t, 10*time.Second, &out)
	// --log-format json: every line local mode writes is one JSON object,
	// the job event lines among them.
	for _, name := range []string{"first", "second"} {
		s.checkJobEvents(t, out.String(), "json", name, "success")
	}
	// An info line is a job event or local mode's own start: what the cores
	// do with each job is said at debug level (a warning is a warning).
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if m.Level != "INFO" {
			continue
		}
		switch m.Msg {
		case msgPickedUp, msgRunning, msgFinished, "registered with Gitea", msgRunningLocal:
		default:
			t.Errorf("at info level, a line that is no job event: %s", line)
		}
	}
}

func TestE2ELocalSurvivesSIGKILL(t *testing.T) {
	s := newSetup(t)
	var out syncBuffer
	first := startLocal(t, &out, s.args(true)...)
	s.gitea.PushWorkflow(t, s.repo, ".gitea/workflows/ci.yml", `name: ci
on: [push]
jobs:
  long:
    runs-on: ubuntu-latest
    steps:
      - run: sleep 6
      - run: echo finished-once
`)
	s.waitJob(t, "long", func(j giteaenv.Job) bool {
		return j.Status == "in_progress" && len(j.Steps) > 0 && j.Steps[0].Status == "in_progress"
	}, 60*time.Second, &out)
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	time.Sleep(time.Second)
	startLocal(t, &out, s.args(false)...)
	long := s.waitJob(t, "long", completed, 90*time.Second, &out)
	if long.Conclusion != "success" {
		t.Fatalf("long = %+v\n%s", long, out.String())
	}
	logs := s.gitea.JobLogs(t, s.repo, long.ID)
	if n := strings.Count(logs, "finished-once"); n != 1 {
		t.Fatalf("the job's last step ran %d times:\n%s", n, logs)
	}
	if jobs := s.gitea.Jobs(t, s.repo); len(jobs) != 1 || jobs[0].RunAttempt > 1 {
		t.Fatalf("jobs = %+v", jobs)
	}
	if c := strings.Count(out.String(), "task handed to its executor"); c != 1 {
		t.Fatalf("the task was handed out %d times:\n%s", c, out.String())
	}
	// Picked up and running said by the first local mode, finished by the
	// second, with the job, URL and duration all the same.
	s.waitNoExecutors(t, 20*time.Second, &out)
	s.checkJobEvents(t, out.String(), "text", "long", "success")
}

func TestE2ELocalFailsFastOnBadInput(t *testing.T) {
	s := newSetup(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unreachable Gitea", []string{"--gitea-url", "http://127.0.0.1:1/", "--registration-token-file", tokenFile(t, "x"), "--state-dir", s.state, "--gateway-addr", s.gateway}, "cannot reach Gitea at http://127.0.0.1:1/"},
		{"wrong registration token", []string{"--gitea-url", s.gitea.URL, "--registration-token-file", tokenFile(t, "not-a-token"), "--state-dir", s.state, "--gateway-addr", s.gateway}, "refused the registration token"},
		{"no token on a first start", []string{"--gitea-url", s.gitea.URL, "--state-dir", s.state, "--gateway-addr", s.gateway}, "a registration token is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(localBinary(t), tc.args...)
			start := time.Now()
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Fatalf("local = %v:\n%s\nwant it to say %q", err, out, tc.want)
			}
			t.Logf("failed in %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
			if _, err := os.Stat(filepath.Join(s.state, "credentials.json")); err == nil {
				t.Fatal("credentials were written after a failed start")
			}
		})
	}
	// Nothing left confuses the next, correct start.
	var out syncBuffer
	startLocal(t, &out, s.args(true)...)
	s.gitea.PushWorkflow(t, s.repo, ".gitea/workflows/ci.yml", "name: ci\non: [push]\njobs:\n  ok:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo fine\n")
	if j := s.waitJob(t, "ok", completed, 60*time.Second, &out); j.Conclusion != "success" {
		t.Fatalf("ok = %+v", j)
	}
}
