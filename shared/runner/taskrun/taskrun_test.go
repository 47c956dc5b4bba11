//go:build !race

// act v0.261.10 host mode races on its own pty writer (host_environment.go);
// these tests drive act, so they run in `make test`'s pass without -race.

package taskrun

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/structpb"
)

// recorder is a Reporter that keeps what act tells it.
type recorder struct {
	mu      sync.Mutex
	ctx     context.Context
	rows    []string
	shown   []string // every entry at info level or above, as the job log shows it
	results map[int]string
	job     string
	outputs map[string]string
}

func newRecorder(ctx context.Context) *recorder {
	return &recorder{ctx: ctx, results: map[int]string{}}
}

func (r *recorder) Levels() []logrus.Level { return logrus.AllLevels }

func (r *recorder) Fire(e *logrus.Entry) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if raw, _ := e.Data["raw_output"].(bool); raw {
		r.rows = append(r.rows, strings.TrimSpace(e.Message))
	}
	if e.Level <= logrus.InfoLevel {
		r.shown = append(r.shown, e.Message)
	}
	if res, ok := e.Data["stepResult"]; ok {
		if n, ok := e.Data["stepNumber"].(int); ok {
			if ids, _ := e.Data["stepID"].([]string); len(ids) <= 1 {
				r.results[n] = fmt.Sprint(res)
			}
		}
	}
	if res, ok := e.Data["jobResult"].(string); ok {
		r.job = res
	}
	return nil
}

func (r *recorder) JobContext() context.Context { return r.ctx }
func (r *recorder) Logf(string, ...any)         {}
func (r *recorder) SetOutputs(o map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outputs = o
}

func task(t *testing.T, workflow string, needs map[string]*runnerv1.TaskNeed) *runnerv1.Task {
	t.Helper()
	c, err := structpb.NewStruct(map[string]any{
		"repository": "alice/repo", "repository_owner": "alice", "job": "build", "run_id": "3",
		"server_url": "http://127.0.0.1:1/", "gitea_default_actions_url": "https://github.com",
		"token": "task-token", "event_name": "push", "event": map[string]any{"ref": "refs/heads/main"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &runnerv1.Task{Id: 7, Context: c, WorkflowPayload: []byte(workflow), Needs: needs,
		Secrets: map[string]string{"GITEA_TOKEN": "task-token", "GREETING": "hello"}, Vars: map[string]string{"COLOR": "blue"}}
}

func run(t *testing.T, tk *runnerv1.Task, ctx context.Context) (*recorder, error) {
	t.Helper()
	job, err := Prepare(tk, Host{})
	if err != nil {
		t.Fatal(err)
	}
	r := newRecorder(ctx)
	dir := t.TempDir()
	err = job.Run(context.Background(), r, Options{WorkDir: dir + "/work", CacheDir: dir + "/cache"})
	return r, err
}

func TestRunStepsOutputsNeedsVarsSecrets(t *testing.T) {
	const wf = `name: ci
on: push
jobs:
  build:
    name: build
    runs-on: ubuntu-latest
    outputs:
      answer: ${{ steps.compute.outputs.answer }}
    steps:
      - id: compute
        run: echo "answer=42" >> "$GITHUB_OUTPUT"
      - run: echo "color=${{ vars.COLOR }} prev=${{ needs.prepare.outputs.seed }} greet=${{ secrets.GREETING }} server=${{ github.server_url }}"
      - if: ${{ needs.prepare.result == 'success' }}
        run: echo needs-ok
`
	r, err := run(t, task(t, wf, map[string]*runnerv1.TaskNeed{
		"prepare": {Outputs: map[string]string{"seed": "s1"}, Result: runnerv1.Result_RESULT_SUCCESS},
	}), context.Background())
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(r.rows, "\n")
	for _, want := range []string{"color=blue prev=s1 greet=hello server=http://127.0.0.1:1", "needs-ok"} {
		if !strings.Contains(all, want) {
			t.Errorf("the log lacks %q:\n%s", want, all)
		}
	}
	if r.job != "success" || r.results[0] != "success" || r.results[1] != "success" || r.results[2] != "success" {
		t.Fatalf("job %q, steps %v", r.job, r.results)
	}
	if r.outputs["answer"] != "42" {
		t.Fatalf("outputs = %v", r.outputs)
	}
}

func TestRunFailingStepFailsTheJob(t *testing.T) {
	const wf = "on: push\njobs:\n  build:\n    runs-on: x\n    steps:\n      - run: exit 3\n      - run: echo never\n      - if: always()\n        run: echo cleanup\n"
	r, err := run(t, task(t, wf, nil), context.Background())
	if err == nil {
		t.Fatal("a failing job returned no error")
	}
	if r.job != "failure" || r.results[0] != "failure" || r.results[1] != "skipped" || r.results[2] != "success" {
		t.Fatalf("job %q, steps %v", r.job, r.results)
	}
}

func TestRunStopsWhenCancelled(t *testing.T) {
	const wf = "on: push\njobs:\n  build:\n    runs-on: x\n    steps:\n      - run: sleep 60\n"
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(2*time.Second, cancel)
	start := time.Now()
	_, _ = run(t, task(t, wf, nil), ctx)
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("the cancelled job ran %v", d)
	}
}

func TestPrepareRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, wf, hostImage, want string
	}{
		{"services", "jobs:\n  b:\n    runs-on: x\n    services:\n      db:\n        image: postgres\n    steps:\n      - run: true\n", "", "services:"},
		{"foreign container", "jobs:\n  b:\n    runs-on: x\n    container: golang:1.26\n    steps:\n      - run: true\n", "alpine", "container: golang:1.26"},
		{"container in local mode", "jobs:\n  b:\n    runs-on: x\n    container: node:20\n    steps:\n      - run: true\n", "",
			"this job asks for `container: node:20`, but its executor is a process on this machine (local mode, or a process pool): no container, and no Docker daemon to start one; run it on a pod pool (the cluster path runs the job in node:20)"},
		{"docker:// step", "jobs:\n  b:\n    runs-on: x\n    steps:\n      - run: true\n      - name: lint\n        uses: docker://alpine:3.20\n", "",
			"step lint uses `docker://alpine:3.20`, an image to run with Docker, and this executor has no Docker daemon (no Docker daemon: nothing at /var/run/docker.sock): `docker://` steps and Docker actions run in a job of a pod pool whose profile enables the docker capability (`docker:`), or in local mode on a machine with a Docker daemon"},
		{"docker:// step names the build capability", "jobs:\n  b:\n    runs-on: x\n    steps:\n      - uses: docker://moby/buildkit\n", "",
			"to build an image without a daemon, run `buildctl` (BUILDKIT_HOST) in a job of a pod pool whose profile enables the build capability (`build:`)"},
		{"container options", "jobs:\n  b:\n    runs-on: x\n    container:\n      image: golang:1.26\n      options: --cpus 1\n    steps:\n      - run: true\n", "golang:1.26", "options"},
	} {
		_, err := Prepare(task(t, tc.wf, nil), Host{Image: tc.hostImage, NoDocker: "no Docker daemon: nothing at /var/run/docker.sock"})
		var ue *UnsupportedError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Prepare() = %v, want an UnsupportedError mentioning %q", tc.name, err, tc.want)
		}
	}
	job, err := Prepare(task(t, "jobs:\n  b:\n    runs-on: x\n    container:\n      image: golang:1.26\n      env:\n        GOFLAGS: -mod=mod\n    steps:\n      - run: true\n", nil), Host{Image: "golang:1.26"})
	if err != nil || job.env["GOFLAGS"] != "-mod=mod" {
		t.Fatalf("the host's own image: %v, env %v", err, job)
	}
	// With a daemon, a docker:// step is act's to run.
	if _, err := Prepare(task(t, "jobs:\n  b:\n    runs-on: x\n    steps:\n      - uses: docker://alpine:3.20\n", nil), Host{Docker: "unix:///run/gdr-docker/docker.sock"}); err != nil {
		t.Fatalf("a docker:// step beside a daemon: %v", err)
	}
	if _, err := Prepare(task(t, "jobs:\n  a:\n    runs-on: x\n  b:\n    runs-on: x\n", nil), Host{}); err == nil {
		t.Fatal("two jobs prepared")
	}
}

// A Docker action (runs.using: docker) fails its step at once, the job log
// saying why and what to do instead, not act's "Cannot connect to the
// Docker daemon"; the steps after it are skipped.
func TestRunDockerActionSaysWhy(t *testing.T) {
	wf := `jobs:
  build:
    runs-on: x
    steps:
      - run: |
          mkdir -p dockerized
          printf 'name: d\nruns:\n  using: docker\n  image: Dockerfile\n' > dockerized/action.yml
          echo FROM alpine > dockerized/Dockerfile
      - uses: ./dockerized
      - run: echo after
`
	start := time.Now()
	r, err := run(t, task(t, wf, nil), context.Background())
	if err == nil || r.job != "failure" || r.results[1] != "failure" || r.results[2] != "skipped" {
		t.Fatalf("err %v, job %q, steps %v: want the Docker action's step failed, the next skipped", err, r.job, r.results)
	}
	log := strings.Join(r.shown, "\n")
	if strings.Contains(log, dockerDaemonError) || !strings.Contains(log, "this step runs a Docker action (`runs.using: docker`), which needs a Docker daemon, and this executor has none: `docker://` steps and Docker actions run in a job of a pod pool whose profile enables the docker capability (`docker:`)") ||
		!strings.Contains(log, "enables the build capability (`build:`)") {
		t.Fatalf("the job log:\n%s", log)
	}
	t.Logf("failed in %v", time.Since(start).Round(time.Millisecond))
}
