//go:build e2e

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gateway"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// runnerBinary builds this command once per test process.
func runnerBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gdr-runner-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "runner")
		if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// firstStep records when the first step of each task is reported running.
type firstStep struct {
	gateway.Forwarder
	mu   sync.Mutex
	seen map[int64]time.Time
}

func (f *firstStep) UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	if steps := req.GetState().GetSteps(); len(steps) > 0 && steps[0].GetStartedAt() != nil {
		f.mu.Lock()
		if _, ok := f.seen[req.GetState().GetId()]; !ok {
			f.seen[req.GetState().GetId()] = time.Now()
		}
		f.mu.Unlock()
	}
	return f.Forwarder.UpdateTask(ctx, req)
}

// world is a real Gitea, NATS, dispatch's core for one pool, and a gateway.
type world struct {
	gitea      *giteaenv.Server
	repo       string
	pool       dispatcher.Pool
	d          *dispatcher.Dispatcher
	gatewayURL string
	ca         *svidca.CA
	boot       *bootstrap.Bootstrap
	steps      *firstStep
	payloads   *assignmentqueue.Payloads
}

func newWorld(t testing.TB) *world {
	t.Helper()
	ctx := context.Background()
	g := giteaenv.Start(t, giteaenv.Options{ChannelQueue: true})
	w := &world{gitea: g, repo: g.CreateRepo(t, "demo")}
	creds, err := gitea.Register(ctx, g.URL, nil, gitea.Registration{Token: g.RegistrationToken(t), Name: "e2e-linux", Labels: []string{"ubuntu-latest"}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := gitea.NewClient(g.URL, nil, creds)
	if err != nil {
		t.Fatal(err)
	}
	w.pool = dispatcher.Pool{
		Pool:         runnerpool.Pool{Name: "linux", Labels: []string{"ubuntu-latest"}, Backend: taskassignment.BackendProcess, Capacity: 10},
		Registration: client, Tasks: gitea.TaskState{Client: client},
	}
	env := jetstreamenv.NewQueue(t)
	payloads := env.Payloads
	w.payloads = payloads
	w.d = &dispatcher.Dispatcher{TrustDomain: td, Queue: env.Queue, Payloads: payloads, KeepAlive: time.Minute}
	if w.ca, err = svidca.New(td); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.gatewayURL = "https://" + ln.Addr().String()
	if w.boot, err = bootstrap.New(bytes.Repeat([]byte{8}, 32), w.gatewayURL, spiffeid.RequireFromString("spiffe://ci.example.org/gateway")); err != nil {
		t.Fatal(err)
	}
	w.steps = &firstStep{Forwarder: client, seen: map[int64]time.Time{}}
	gw := &gateway.Gateway{TrustDomain: td, Pools: map[string]gateway.Forwarder{"linux": w.steps}, Payloads: payloads, Capabilities: w.boot}
	server, err := w.ca.Mint(spiffeid.RequireFromPath(td, "/gateway"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw.Handler()}
	go func() { _ = srv.Serve(tls.NewListener(ln, tlsconfig.MTLSServerConfig(server, w.ca, gw.Authorizer()))) }()
	t.Cleanup(func() { _ = srv.Close() })
	return w
}

// claim dispatches until one task is claimed and returns its assignment.
func (w *world) claim(t testing.TB) taskassignment.Assignment {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := w.d.Dispatch(context.Background(), w.pool)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Claimed) > 0 {
			return res.Claimed[0]
		}
		if time.Now().After(deadline) {
			t.Fatal("no task to claim")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// start launches the runner for a, as a backend would.
func (w *world) start(t testing.TB, a taskassignment.Assignment) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	return w.startWith(t, w.boot, a)
}

// startWith launches the runner for a with boot's environment.
func (w *world) startWith(t testing.TB, boot *bootstrap.Bootstrap, a taskassignment.Assignment) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	env, err := boot.Environment(a)
	if err != nil {
		t.Fatal(err)
	}
	svid, err := w.ca.Mint(spiffeid.RequireFromString(a.Identity.SPIFFEID), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := svid.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := w.ca.Bundle().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(runnerBinary(t))
	cmd.Env = append(os.Environ(), "GDR_WORK_DIR="+t.TempDir(),
		bootstrap.EnvSVIDCert+"="+string(cert), bootstrap.EnvSVIDKey+"="+string(key), bootstrap.EnvSVIDBundle+"="+string(bundle))
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &stderr
}

// runTask runs the runner for a to its end and returns its exit status.
func (w *world) runTask(t testing.TB, a taskassignment.Assignment) int {
	t.Helper()
	cmd, stderr := w.start(t, a)
	err := cmd.Wait()
	if err != nil {
		t.Logf("runner of task %d: %v\n%s", a.Task.ID, err, stderr)
	}
	return cmd.ProcessState.ExitCode()
}

func (w *world) job(t *testing.T, name string) giteaenv.Job {
	t.Helper()
	for _, j := range w.gitea.Jobs(t, w.repo) {
		if j.Name == name {
			return j
		}
	}
	t.Fatalf("no job %q", name)
	return giteaenv.Job{}
}

const secretValue = "hunter2-very-secret-value"

func TestE2ERunnerRunsAJobWithNeedsOutputsVarsAndSecrets(t *testing.T) {
	w := newWorld(t)
	w.gitea.SetSecret(t, w.repo, "MY_SECRET", secretValue)
	w.gitea.SetVariable(t, w.repo, "COLOR", "blue")
	w.gitea.PushWorkflow(t, w.repo, ".gitea/workflows/ci.yml", `name: ci
on: [push]
jobs:
  prepare:
    runs-on: ubuntu-latest
    outputs:
      seed: ${{ steps.s.outputs.seed }}
    steps:
      - id: s
        run: echo "seed=s1" >> "$GITHUB_OUTPUT"
  build:
    needs: prepare
    runs-on: ubuntu-latest
    steps:
      - name: show
        run: echo "color=${{ vars.COLOR }} seed=${{ needs.prepare.outputs.seed }}"
      - name: secret
        run: echo "the secret is ${{ secrets.MY_SECRET }}"
      - name: env leak
        run: env | grep -c CI_RUNNER_CAPABILITY || echo "no capability in env"
`)
	prepare := w.claim(t)
	if prepare.Identity.Task != "prepare" {
		t.Fatalf("claimed %q first", prepare.Identity.Task)
	}
	if code := w.runTask(t, prepare); code != 0 {
		t.Fatalf("runner exited %d", code)
	}
	build := w.claim(t)
	if code := w.runTask(t, build); code != 0 {
		t.Fatalf("runner exited %d", code)
	}
	for _, name := range []string{"prepare", "build"} {
		j := w.gitea.WaitJob(t, w.repo, func(j giteaenv.Job) bool { return j.Name == name && j.Status == "completed" }, 20*time.Second)
		if j.Conclusion != "success" {
			t.Fatalf("job %s: %+v", name, j)
		}
	}
	j := w.job(t, "build")
	var results []string
	for _, s := range j.Steps {
		results = append(results, s.Name+"="+s.Conclusion)
	}
	if len(j.Steps) < 3 || strings.Count(strings.Join(results, " "), "=success") < 3 {
		t.Fatalf("steps = %v", results)
	}
	logs := w.gitea.JobLogs(t, w.repo, j.ID)
	for _, want := range []string{"color=blue seed=s1", "the secret is ***", "no capability in env"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, secretValue) {
		t.Fatalf("the secret reached Gitea's log:\n%s", logs)
	}
}

// The runner talks to the gateway it was told of and no other member of the
// trust domain: told to expect another SPIFFE ID, it refuses the real
// gateway at the handshake and never gets its task.
func TestE2ERunnerRefusesAGatewayOfAnotherIdentity(t *testing.T) {
	w := newWorld(t)
	w.gitea.PushWorkflow(t, w.repo, ".gitea/workflows/ci.yml", "name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo hi\n")
	a := w.claim(t)
	expectOther, err := bootstrap.New(bytes.Repeat([]byte{8}, 32), w.gatewayURL, spiffeid.RequireFromString("spiffe://ci.example.org/not-the-gateway"))
	if err != nil {
		t.Fatal(err)
	}
	cmd, stderr := w.startWith(t, expectOther, a)
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), "gateway unreachable") {
		if time.Now().After(deadline) {
			t.Fatalf("the runner did not refuse the gateway:\n%s", stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), `unexpected ID \"spiffe://ci.example.org/gateway\"`) {
		t.Fatalf("refused, but not for the gateway's identity:\n%s", stderr)
	}
	if started, err := w.payloads.Started(context.Background(), a.ID); err != nil || started {
		t.Fatalf("the task was handed out (started %v, %v)", started, err)
	}
}

func TestE2EFailingStepFailsTheJob(t *testing.T) {
	w := newWorld(t)
	w.gitea.PushWorkflow(t, w.repo, ".gitea/workflows/ci.yml",
		"name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo before\n      - run: exit 3\n      - run: echo never\n")
	a := w.claim(t)
	if code := w.runTask(t, a); code != 0 {
		t.Fatalf("runner exited %d: a failed job is still a reported one", code)
	}
	j := w.gitea.WaitJob(t, w.repo, func(j giteaenv.Job) bool { return j.Status == "completed" }, 20*time.Second)
	if j.Conclusion != "failure" {
		t.Fatalf("job = %+v", j)
	}
	if len(j.Steps) != 3 || j.Steps[0].Conclusion != "success" || j.Steps[1].Conclusion != "failure" || j.Steps[2].Conclusion != "skipped" {
		t.Fatalf("steps = %+v", j.Steps)
	}
}

func TestE2EServicesJobFailsWithAClearLine(t *testing.T) {
	w := newWorld(t)
	w.gitea.PushWorkflow(t, w.repo, ".gitea/workflows/ci.yml",
		"name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    services:\n      db:\n        image: postgres:16\n    steps:\n      - run: echo hi\n")
	a := w.claim(t)
	if code := w.runTask(t, a); code != 0 {
		t.Fatalf("runner exited %d", code)
	}
	j := w.gitea.WaitJob(t, w.repo, func(j giteaenv.Job) bool { return j.Status == "completed" }, 20*time.Second)
	if j.Conclusion != "failure" || !strings.Contains(w.gitea.JobLogs(t, w.repo, j.ID), "services:") {
		t.Fatalf("job = %+v", j)
	}
}

func TestE2ECancelStopsTheStep(t *testing.T) {
	w := newWorld(t)
	w.gitea.PushWorkflow(t, w.repo, ".gitea/workflows/ci.yml",
		"name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: sleep 120\n")
	a := w.claim(t)
	cmd, stderr := w.start(t, a)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	// Wait until the step runs.
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.steps.mu.Lock()
		_, running := w.steps.seen[a.Task.ID]
		w.steps.mu.Unlock()
		if running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the step never started:\n%s", stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	j := w.job(t, "build")
	cancelled := time.Now()
	w.gitea.CancelRun(t, w.repo, j.RunID)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the runner did not stop after the cancel:\n%s", stderr)
	}
	took := time.Since(cancelled)
	if cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("runner exited %d:\n%s", cmd.ProcessState.ExitCode(), stderr)
	}
	j = w.gitea.WaitJob(t, w.repo, func(j giteaenv.Job) bool { return j.Status == "completed" }, 20*time.Second)
	if j.Conclusion != "cancelled" {
		t.Fatalf("job = %+v", j)
	}
	// The reporter's heartbeat (5 s) sees the cancel; the step stops at once.
	if took > 12*time.Second {
		t.Fatalf("the runner took %v to stop after the cancel", took)
	}
	t.Logf("cancel to runner exit: %v", took)
}
