//go:build e2e

package opensandbox_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/opensandboxenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gateway"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/spiremint"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/pull"
)

const (
	jobsPool   = "sandboxes"
	jobsLabel  = "opensandbox"
	jobsPrefix = "gdr-e2e.example.org"
	// jobsSecret is a repository secret a job echoes: Gitea's log must show
	// *** in its place.
	jobsSecret = "opensandbox-e2e-secret-5f1c"
	// jobsCapacity is the pool's capacity: at most this many sandboxes at
	// once on the 2 shared cores.
	jobsCapacity = 2
)

// imagesDir is the folder `make images` wrote ($GDR_IMAGES_DIR, else
// bin/images of the checkout); the test needs runner-host from it.
func imagesDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("GDR_IMAGES_DIR")
	if dir == "" {
		var err error
		if dir, err = filepath.Abs("../../../bin/images"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "runner-host", "index.json")); err != nil {
		testenv.Unavailable(t, "image runner-host not built in "+dir+": run `make images`")
	}
	return dir
}

// stepWatch is the gateway's forwarder to Gitea, recording when each task's
// first step is reported started.
type stepWatch struct {
	gateway.Forwarder
	mu      sync.Mutex
	started map[int64]bool
}

func (s *stepWatch) UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	if steps := req.GetState().GetSteps(); len(steps) > 0 && steps[0].GetStartedAt() != nil {
		s.mu.Lock()
		s.started[req.GetState().GetId()] = true
		s.mu.Unlock()
	}
	return s.Forwarder.UpdateTask(ctx, req)
}

func (s *stepWatch) running(taskID int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started[taskID]
}

// jobsRuntime is what the jobs world needs of a lifecycle server and the
// runtime behind it.
type jobsRuntime struct {
	s *opensandboxenv.Server
	// image and limits are the pool profile's: the job image (runner-host)
	// as the runtime holds it, and each sandbox's resources.
	image  string
	limits map[string]string
	// gitea starts Gitea where the sandboxes reach it (its ROOT_URL, which
	// the test process reaches too).
	gitea func(t *testing.T) *giteaenv.Server
	// reach makes a server listening at addr (127.0.0.1:<port> of the
	// machine) reachable from the sandboxes, and returns the address they
	// reach it at.
	reach func(addr string) (string, error)
	// leftovers names what of the sandboxes is left in the runtime
	// (containers, Pods).
	leftovers func(ctx context.Context) ([]string, error)
}

// dockerJobsRuntime starts the server of the Docker runtime with the job
// image; sandboxes reach the machine's 127.0.0.1 through Expose.
func dockerJobsRuntime(ctx context.Context, t *testing.T) jobsRuntime {
	t.Helper()
	images := imagesDir(t)
	s := opensandboxenv.Start(ctx, t, opensandboxenv.Options{NoRunner: true, JobImage: filepath.Join(images, "runner-host")})
	return jobsRuntime{
		s: s, image: opensandboxenv.JobImageName,
		limits: map[string]string{"cpu": "1", "memory": "1Gi"},
		gitea: func(t *testing.T) *giteaenv.Server {
			g := giteaenv.Start(t, giteaenv.Options{ChannelQueue: true})
			gu, err := url.Parse(g.URL)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Expose(gu.Host); err != nil {
				t.Fatal(err)
			}
			return g
		},
		reach: func(addr string) (string, error) { return addr, s.Expose(addr) },
		leftovers: func(ctx context.Context) ([]string, error) {
			out, err := s.Docker(ctx, "ps", "-a", "--filter", "label=opensandbox.io/id", "--format", "{{.Names}} {{.Status}}")
			if err != nil {
				return nil, err
			}
			var left []string
			for _, c := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if c != "" {
					left = append(left, "container "+c)
				}
			}
			return left, nil
		},
	}
}

// jobsWorld is a real Gitea, NATS, SPIRE and OpenSandbox server (of the
// runtime jobsRuntime starts), with dispatch's, handle's and recover's
// cores and the gateway running in the test process as their commands wire
// them.
type jobsWorld struct {
	rt    jobsRuntime
	s     *opensandboxenv.Server
	api   *sandboxapi.Client
	gitea *giteaenv.Server
	queue *jetstreamenv.Queue
	keys  taskassignment.Keys
	steps *stepWatch
	// pauseRecover is held by a test that must see a fault before recover
	// acts on it; recover's loop takes it for every pass.
	pauseRecover sync.Mutex

	mu      sync.Mutex
	claimed map[string]taskassignment.Assignment // by job name (unique across cases)
	// most is the most sandboxes of this installation the server listed
	// at once (sampled every 500 ms).
	most int
}

func newJobsWorld(ctx context.Context, t *testing.T, rt jobsRuntime) *jobsWorld {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	s := rt.s
	spire := spireenv.Start(t)
	if spire.TrustDomain != td {
		t.Fatalf("spireenv serves %s, the test expects %s", spire.TrustDomain, td)
	}
	g := rt.gitea(t)
	g.HostAction(t, giteaenv.VendoredAction("checkout-v4"), "actions", "checkout", "v4")

	api, err := sandboxapi.New(sandboxapi.Options{BaseURL: s.URL, APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	w := &jobsWorld{rt: rt, s: s, api: api, gitea: g, claimed: map[string]taskassignment.Assignment{}}
	creds, err := gitea.Register(ctx, g.URL, nil, gitea.Registration{Token: g.RegistrationToken(t), Name: "e2e-opensandbox", Labels: []string{jobsLabel}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := gitea.NewClient(g.URL, nil, creds)
	if err != nil {
		t.Fatal(err)
	}
	tasks := gitea.TaskState{Client: client}
	w.queue = jetstreamenv.NewQueue(t)
	consumer := w.queue.OpenConsumer(t, taskassignment.BackendOpenSandbox, jobsCapacity)
	if w.keys, err = taskassignment.NewKeys(jobsPrefix); err != nil {
		t.Fatal(err)
	}
	profile, err := json.Marshal(opensandbox.Profile{
		Image:          rt.image,
		Entrypoint:     []string{"/usr/local/bin/runner"},
		ResourceLimits: rt.limits,
	})
	if err != nil {
		t.Fatal(err)
	}
	pool := runnerpool.Pool{Name: jobsPool, Labels: []string{jobsLabel}, Backend: taskassignment.BackendOpenSandbox,
		Capacity: jobsCapacity, JobTimeout: runnerpool.Duration(15 * time.Minute), Profile: profile}

	logf, err := os.Create(filepath.Join(t.TempDir(), "cores.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- the cores' log (tail)\n%s", testenv.LogTail(logf.Name(), 60))
		}
		_ = logf.Close()
	})
	log := slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelDebug}))

	// The gateway, with an SVID from SPIRE (as an agent would give it),
	// reachable from the sandboxes at its own address.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gwAddr, err := rt.reach(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	gatewayID := spiffeid.RequireFromPath(td, bootstrap.DefaultGatewayPath)
	boot, err := bootstrap.New(bytes.Repeat([]byte{9}, 32), "https://"+gwAddr, gatewayID)
	if err != nil {
		t.Fatal(err)
	}
	gwSVID, gwBundle, err := spiremint.New(spire.Conn()).MintX509SVID(ctx, gatewayID, 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w.steps = &stepWatch{Forwarder: client, started: map[int64]bool{}}
	gw := &gateway.Gateway{TrustDomain: td, Pools: map[string]gateway.Forwarder{jobsPool: w.steps},
		Payloads: w.queue.Payloads, Capabilities: boot, Log: log}
	srv := &http.Server{Handler: gw.Handler()}
	go func() {
		_ = srv.Serve(tls.NewListener(ln, tlsconfig.MTLSServerConfig(gwSVID, gwBundle, gw.Authorizer())))
	}()
	t.Cleanup(func() { _ = srv.Close() })

	// handle's and recover's backends, each built as its command builds it.
	settings := backend.BuildSettings{OpenSandboxSettings: backend.OpenSandboxSettings{OpenSandboxURL: s.URL, OpenSandboxKey: s.APIKey, OpenSandboxSPIRE: "unix:" + spire.Socket}}
	deps := backend.Deps{Keys: w.keys, TrustDomain: td, Pools: runnerpool.Pools{pool}, Log: log}
	handleBackend, closeHandle, err := opensandbox.Build(settings, deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeHandle() })
	recoverBackend, closeRecover, err := opensandbox.Build(settings, deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeRecover() })

	d := &dispatcher.Dispatcher{TrustDomain: td, Queue: w.queue.Queue, Payloads: w.queue.Payloads, KeepAlive: time.Minute, Log: log}
	dpool := dispatcher.Pool{Pool: pool, Registration: client, Tasks: tasks}
	job := pull.Assignments{
		Decider: handler.Handler{
			Worker: executor.Worker{Backend: handleBackend, Bootstrap: boot, Keys: w.keys, Endings: w.queue.Endings,
				OnEvent: func(e executor.Event) {
					log.Debug(string(e.Name), slog.String("assignment", e.AssignmentID), slog.String("executor", e.Executor), slog.String("phase", string(e.Phase)))
				}},
			TrustDomain: td, Keys: w.queue.Signer,
		},
		Log: log, Consumer: consumer, Batch: jobsCapacity, Wait: time.Second,
	}
	rec := &recoverer.Recoverer{
		TrustDomain: td, Keys: w.keys, Bootstrap: boot,
		Backends: map[taskassignment.BackendKind]executor.Backend{taskassignment.BackendOpenSandbox: recoverBackend},
		Pools:    map[string]recoverer.Pool{jobsPool: {Pool: pool, Tasks: tasks}},
		Queue:    w.queue.Queue, Sender: w.queue.Queue, Rejections: w.queue.Queue,
		Payloads: w.queue.Payloads, Endings: w.queue.Endings, Log: log,
	}

	// The three loops, stopped before anything they use (cleanups run last
	// registered first).
	loops, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	every := func(name string, interval time.Duration, f func(context.Context) error) {
		wg.Go(func() {
			for loops.Err() == nil {
				if err := f(loops); err != nil && loops.Err() == nil {
					log.Warn(name+" failed", slog.Any("error", err))
				}
				select {
				case <-loops.Done():
				case <-time.After(interval):
				}
			}
		})
	}
	// dispatch's rounds.
	every("dispatch", time.Second, func(ctx context.Context) error {
		res, err := d.Dispatch(ctx, dpool)
		w.mu.Lock()
		for _, a := range res.Claimed {
			w.claimed[a.Identity.Task] = a
		}
		w.mu.Unlock()
		return err
	})
	// handle's runs, one after the other, as KEDA's Jobs would.
	every("handle", 0, func(ctx context.Context) error {
		_, err := job.Run(ctx)
		if err != nil {
			time.Sleep(time.Second)
		}
		return err
	})
	// The pool's capacity, watched on the server.
	every("watch", 500*time.Millisecond, func(ctx context.Context) error {
		sbs, err := w.api.List(ctx, sandboxapi.ListFilter{Metadata: w.keys.RunnerSelector()})
		w.mu.Lock()
		w.most = max(w.most, len(sbs))
		w.mu.Unlock()
		return err
	})
	// recover's passes, as its CronJob would (every 2 s here).
	every("recover", 2*time.Second, func(ctx context.Context) error {
		w.pauseRecover.Lock()
		defer w.pauseRecover.Unlock()
		sum, err := rec.Run(ctx)
		log.Info("recover pass", sum.Attrs()...)
		return err
	})
	return w
}

// assignment waits for dispatch to claim the job named name.
func (w *jobsWorld) assignment(t *testing.T, name string, timeout time.Duration) taskassignment.Assignment {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		a, ok := w.claimed[name]
		w.mu.Unlock()
		if ok {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("dispatch did not claim job %q in %v", name, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sandbox waits for the sandbox of assignment a to exist and returns it.
func (w *jobsWorld) sandbox(ctx context.Context, t *testing.T, a taskassignment.Assignment, timeout time.Duration) sandboxapi.Sandbox {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got, err := w.api.List(ctx, sandboxapi.ListFilter{Metadata: map[string]string{w.keys.AssignmentID: a.ID}})
		if err != nil {
			t.Fatalf("list the sandboxes of assignment %s: %v", a.ID, err)
		}
		if len(got) == 1 {
			return got[0]
		}
		if len(got) > 1 || time.Now().After(deadline) {
			t.Fatalf("assignment %s has %d sandboxes after %v, want 1", a.ID, len(got), timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitStepRunning waits until the runner reported the task's first step
// started.
func (w *jobsWorld) waitStepRunning(t *testing.T, a taskassignment.Assignment, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !w.steps.running(a.Task.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("task %d (job %s): no step started in %v", a.Task.ID, a.Identity.Task, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitGone waits until GET of sandbox id answers 404 and returns how long
// that took.
func (w *jobsWorld) waitGone(ctx context.Context, t *testing.T, id string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		sb, err := w.api.Get(ctx, id)
		if sandboxapi.IsNotFound(err) {
			return time.Since(start)
		}
		if err != nil {
			t.Fatalf("get sandbox %s: %v", id, err)
		}
		if time.Since(start) > timeout {
			t.Fatalf("sandbox %s still there after %v: %s %s %s", id, timeout, sb.State, sb.Reason, sb.Message)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// job returns the job of repo named name once pred holds.
func (w *jobsWorld) waitJob(t *testing.T, repo, name string, pred func(giteaenv.Job) bool, timeout time.Duration) giteaenv.Job {
	t.Helper()
	return w.gitea.WaitJob(t, repo, func(j giteaenv.Job) bool { return j.Name == name && pred(j) }, timeout)
}

func completed(j giteaenv.Job) bool { return j.Status == "completed" }

// TestE2EOpenSandboxDockerJobs runs real Gitea jobs in real OpenSandbox
// sandboxes (Docker runtime, the runner-host image): dispatch claims them,
// handle creates a sandbox per job with an SVID from SPIRE, the runner in
// the sandbox reaches the gateway over SPIFFE mTLS and Gitea (checkout,
// actions) at the machine's addresses, and recover's passes finish and
// delete every sandbox. Cases: a successful job (checkout, step outputs, a
// masked secret), a failing one, one cancelled in Gitea, one whose sandbox
// is killed, one whose sandbox vanishes (removed, as at its expiry); then
// nothing is left.
func TestE2EOpenSandboxDockerJobs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	begin := time.Now()
	w := newJobsWorld(ctx, t, dockerJobsRuntime(ctx, t))
	t.Logf("world up in %v", time.Since(begin).Round(time.Second))

	t.Run("Finish", func(t *testing.T) {
		t.Run("Success", func(t *testing.T) {
			t.Parallel()
			w.success(ctx, t)
		})
		t.Run("Failure", func(t *testing.T) {
			t.Parallel()
			w.failure(ctx, t)
		})
		t.Run("Toolbox", func(t *testing.T) {
			t.Parallel()
			w.toolbox(t)
		})
	})
	t.Run("Faults", func(t *testing.T) {
		t.Run("Cancel", func(t *testing.T) {
			t.Parallel()
			w.cancelled(ctx, t)
		})
		t.Run("Killed", func(t *testing.T) {
			t.Parallel()
			w.killed(ctx, t)
		})
		t.Run("Vanished", func(t *testing.T) {
			t.Parallel()
			w.vanished(ctx, t)
		})
	})
	t.Run("NothingLeft", func(t *testing.T) {
		w.nothingLeft(ctx, t)
	})
	t.Logf("all cases in %v", time.Since(begin).Round(time.Second))
}

func (w *jobsWorld) success(ctx context.Context, t *testing.T) {
	repo := w.gitea.CreateRepo(t, "success")
	w.gitea.SetSecret(t, repo, "MY_SECRET", jobsSecret)
	sha := w.gitea.PushWorkflow(t, repo, ".gitea/workflows/ci.yml", `name: ci
on: [push]
jobs:
  success:
    runs-on: `+jobsLabel+`
    steps:
      - uses: actions/checkout@v4
      - name: checked out
        run: test -f .gitea/workflows/ci.yml && echo "checked out $(git rev-parse HEAD) as $(id -u)"
      - id: produce
        run: echo "word=made-by-produce" >> "$GITHUB_OUTPUT"
      - name: consume
        run: echo "consumed ${{ steps.produce.outputs.word }}"
      - name: secret
        run: echo "the secret is ${{ secrets.MY_SECRET }}"
`)
	start := time.Now()
	a := w.assignment(t, "success", 60*time.Second)
	sb := w.sandbox(ctx, t, a, 60*time.Second)
	j := w.waitJob(t, repo, "success", completed, 3*time.Minute)
	t.Logf("job success: %s in %v (sandbox %s)", j.Conclusion, time.Since(start).Round(time.Second), sb.ID)
	logs := w.gitea.JobLogs(t, repo, j.ID)
	if j.Conclusion != "success" {
		t.Fatalf("job = %+v\n%s", j, logs)
	}
	for _, want := range []string{"checked out " + sha + " as 65532", "consumed made-by-produce", "the secret is ***"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the job's log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, jobsSecret) {
		t.Errorf("the secret reached Gitea's log:\n%s", logs)
	}
	took := w.waitGone(ctx, t, sb.ID, 30*time.Second)
	t.Logf("sandbox %s deleted %v after the job's end was seen", sb.ID, took.Round(100*time.Millisecond))
}

// toolboxWorkflow's steps use what docs/OPERATIONS.md's "The runner-host image"
// says the image holds, as ubuntu-latest's common workflows and setup-*
// steps do: checkout (a JavaScript action, run by the image's node), node
// of the promised major or newer with npm running a package script, make
// and gcc building a C program, python3 with its TLS and hashing modules,
// tar --zstd and zstd, git-lfs in the checkout, curl reaching Gitea.
const toolboxWorkflow = `name: ci
on: [push]
jobs:
  toolbox:
    runs-on: ` + jobsLabel + `
    steps:
      - uses: actions/checkout@v4
      - name: node
        run: |
          echo "node $(node --version)"
          test "$(node -p 'process.versions.node.split(".")[0]')" -ge 24
          echo "npm $(npm --version)"
          npm init -y >/dev/null
          npm pkg set scripts.build="node -e \"console.log('npm-run-' + 'ok')\""
          npm run --silent build
      - name: c
        run: |
          printf '#include <stdio.h>\nint main(void) { puts("c-" "ok"); return 0; }\n' > hello.c
          printf 'hello: hello.c\n\tgcc -O2 -o $@ $<\n' > Makefile
          make
          ./hello
      - name: python
        run: python3 -c 'import hashlib, json, ssl, sys; print("python-" + "ok", sys.version_info[:2] >= (3, 11), hashlib.sha256(b"").hexdigest()[:8])'
      - name: zstd
        run: |
          tar --zstd -cf src.tar.zst hello.c Makefile
          zstd -t src.tar.zst
          test "$(tar --zstd -tf src.tar.zst | sort | tr '\n' ' ')" = "Makefile hello.c " && echo "zstd-""ok"
      - name: git-lfs
        run: |
          git lfs version
          git lfs install --local
          git lfs track '*.bin' && grep -q 'filter=lfs' .gitattributes && echo "lfs-""ok"
      - name: curl
        run: curl -sS -o /dev/null -w 'curl-%{http_code}\n' "${{ github.server_url }}/"
`

func (w *jobsWorld) toolbox(t *testing.T) {
	repo := w.gitea.CreateRepo(t, "toolbox")
	w.gitea.PushWorkflow(t, repo, ".gitea/workflows/ci.yml", toolboxWorkflow)
	start := time.Now()
	j := w.waitJob(t, repo, "toolbox", completed, 4*time.Minute)
	logs := w.gitea.JobLogs(t, repo, j.ID)
	t.Logf("job toolbox: %s in %v", j.Conclusion, time.Since(start).Round(time.Second))
	if j.Conclusion != "success" {
		t.Fatalf("job = %+v\n%s", j, logs)
	}
	for _, want := range []string{"node v2", "npm 1", "npm-run-ok", "c-ok", "python-ok True e3b0c442", "zstd-ok", "git-lfs/", "lfs-ok", "curl-200"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the job's log lacks %q:\n%s", want, logs)
		}
	}
	for _, line := range strings.Split(logs, "\n") {
		if _, v, ok := strings.Cut(line, "node v"); ok {
			t.Logf("the image's Node.js: v%s", strings.TrimSpace(v))
		}
	}
}

func (w *jobsWorld) failure(ctx context.Context, t *testing.T) {
	repo := w.gitea.CreateRepo(t, "failure")
	w.gitea.PushWorkflow(t, repo, ".gitea/workflows/ci.yml",
		"name: ci\non: [push]\njobs:\n  failure:\n    runs-on: "+jobsLabel+"\n    steps:\n      - run: echo before\n      - run: exit 3\n      - run: echo never\n")
	a := w.assignment(t, "failure", 60*time.Second)
	sb := w.sandbox(ctx, t, a, 60*time.Second)
	j := w.waitJob(t, repo, "failure", completed, 2*time.Minute)
	if j.Conclusion != "failure" {
		t.Fatalf("job = %+v", j)
	}
	if len(j.Steps) != 3 || j.Steps[0].Conclusion != "success" || j.Steps[1].Conclusion != "failure" || j.Steps[2].Conclusion != "skipped" {
		t.Fatalf("steps = %+v", j.Steps)
	}
	if logs := w.gitea.JobLogs(t, repo, j.ID); !strings.Contains(logs, "exit status 3") {
		t.Errorf("the job's log does not show the step exiting 3:\n%s", logs)
	}
	w.waitGone(ctx, t, sb.ID, 30*time.Second)
}

// sleepingJob pushes a workflow whose one job, name, sleeps for ten
// minutes, and returns its repository, assignment and sandbox once the
// runner has fetched the task and reported its step started.
func (w *jobsWorld) sleepingJob(ctx context.Context, t *testing.T, name string) (string, taskassignment.Assignment, sandboxapi.Sandbox) {
	t.Helper()
	repo := w.gitea.CreateRepo(t, name)
	w.gitea.PushWorkflow(t, repo, ".gitea/workflows/ci.yml",
		"name: ci\non: [push]\njobs:\n  "+name+":\n    runs-on: "+jobsLabel+"\n    steps:\n      - run: sleep 600\n")
	a := w.assignment(t, name, 60*time.Second)
	sb := w.sandbox(ctx, t, a, 60*time.Second)
	w.waitStepRunning(t, a, 90*time.Second)
	return repo, a, sb
}

// whileRecoverWaits runs fault with recover's passes held, so that a test
// sees its fault happen before recover may act on it.
func (w *jobsWorld) whileRecoverWaits(fault func()) {
	w.pauseRecover.Lock()
	defer w.pauseRecover.Unlock()
	fault()
}

func (w *jobsWorld) cancelled(ctx context.Context, t *testing.T) {
	repo, _, sb := w.sleepingJob(ctx, t, "cancel")
	if got, err := w.api.Get(ctx, sb.ID); err != nil || got.State != sandboxapi.StateRunning {
		t.Fatalf("sandbox %s before the cancel: %+v, %v; want Running", sb.ID, got, err)
	}
	j := w.waitJob(t, repo, "cancel", func(giteaenv.Job) bool { return true }, 10*time.Second)
	cancelled := time.Now()
	w.gitea.CancelRun(t, repo, j.RunID)
	took := w.waitGone(ctx, t, sb.ID, 30*time.Second)
	t.Logf("cancel to sandbox gone: %v", took.Round(100*time.Millisecond))
	j = w.waitJob(t, repo, "cancel", completed, 20*time.Second)
	if j.Conclusion != "cancelled" {
		t.Fatalf("job = %+v", j)
	}
	t.Logf("cancel to job cancelled: at most %v", time.Since(cancelled).Round(100*time.Millisecond))
}

func (w *jobsWorld) killed(ctx context.Context, t *testing.T) {
	repo, _, sb := w.sleepingJob(ctx, t, "killed")

	// The fault, seen before recover may act on it.
	w.whileRecoverWaits(func() {
		container := "sandbox-" + sb.ID
		if out, err := w.s.Docker(ctx, "ps", "-q", "--filter", "name=^/"+container+"$", "--filter", "status=running"); err != nil || len(bytes.TrimSpace(out)) == 0 {
			t.Fatalf("no running container %s: %v %s", container, err, out)
		}
		if _, err := w.s.Docker(ctx, "kill", container); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			got, err := w.api.Get(ctx, sb.ID)
			if err != nil {
				t.Fatalf("sandbox %s after the kill: %v", sb.ID, err)
			}
			if got.State == sandboxapi.StateFailed {
				if got.Reason != "CONTAINER_EXITED_ERROR" || !strings.Contains(got.Message, "137") {
					t.Fatalf("sandbox %s after the kill: %s %s %q, want CONTAINER_EXITED_ERROR, code 137", sb.ID, got.State, got.Reason, got.Message)
				}
				t.Logf("observed: killed sandbox: %s %s %q", got.State, got.Reason, got.Message)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s still %s %s 20 s after the kill", sb.ID, got.State, got.Reason)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	released := time.Now()

	j := w.waitJob(t, repo, "killed", completed, 60*time.Second)
	t.Logf("kill seen to job %s: %v", j.Conclusion, time.Since(released).Round(100*time.Millisecond))
	if j.Conclusion != "failure" {
		t.Fatalf("job = %+v", j)
	}
	logs := w.gitea.JobLogs(t, repo, j.ID)
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	last := lines[len(lines)-1]
	// The backend hands the sandbox's status on as the reason: the
	// executor "could not run the job" and why, in the server's words.
	for _, want := range []string{"gitea-dynamic-runner: the executor could not run the job", "its sandbox " + sb.ID + " failed",
		"CONTAINER_EXITED_ERROR", "exited with code 137"} {
		if !strings.Contains(last, want) {
			t.Fatalf("the log's last line does not say why the job failed (%q): %q\n%s", want, last, logs)
		}
	}
	t.Logf("the log's last line: %s", last)
	took := w.waitGone(ctx, t, sb.ID, 30*time.Second)
	t.Logf("job failed to sandbox gone: %v", took.Round(100*time.Millisecond))
}

// vanished: the sandbox of a running job is removed (DELETE, as the server
// removes one at its expiry) while recover waits. The job is failed with a
// reason saying its executor vanished, and no second sandbox is made: the
// task is not sent to handle again, which would run the job once more.
func (w *jobsWorld) vanished(ctx context.Context, t *testing.T) {
	repo, a, sb := w.sleepingJob(ctx, t, "vanished")

	// The fault, seen before recover may act on it.
	w.whileRecoverWaits(func() {
		if err := w.api.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := w.api.Get(ctx, sb.ID); !sandboxapi.IsNotFound(err) {
			t.Fatalf("sandbox %s after its removal: %v, want 404", sb.ID, err)
		}
	})

	j := w.waitJob(t, repo, "vanished", completed, 60*time.Second)
	if j.Conclusion != "failure" {
		t.Fatalf("job = %+v", j)
	}
	logs := w.gitea.JobLogs(t, repo, j.ID)
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "gitea-dynamic-runner: the executor could not run the job: its executor vanished") {
		t.Fatalf("the log's last line does not say the executor vanished: %q\n%s", last, logs)
	}
	// Several recover passes later, still no sandbox of the assignment.
	time.Sleep(6 * time.Second)
	if got, err := w.api.List(ctx, sandboxapi.ListFilter{Metadata: map[string]string{w.keys.AssignmentID: a.ID}}); err != nil || len(got) != 0 {
		t.Fatalf("sandboxes of assignment %s after it vanished: %+v, %v: want none (the job must not run again)", a.ID, got, err)
	}
}

// nothingLeft: no sandbox of this installation on the server, nothing of
// a sandbox in the runtime (a container, a Pod), no payload in the bucket.
func (w *jobsWorld) nothingLeft(ctx context.Context, t *testing.T) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []string
		sbs, err := w.api.List(ctx, sandboxapi.ListFilter{Metadata: w.keys.RunnerSelector()})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range sbs {
			left = append(left, fmt.Sprintf("sandbox %s (%s)", sb.ID, sb.State))
		}
		inRuntime, err := w.rt.leftovers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		left = append(left, inRuntime...)
		ids, err := w.queue.Payloads.IDs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			left = append(left, "payload "+id)
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left after every job ended: %s", strings.Join(left, ", "))
		}
		time.Sleep(time.Second)
	}
	w.mu.Lock()
	most := w.most
	w.mu.Unlock()
	if most > jobsCapacity {
		t.Errorf("the server held %d sandboxes of this installation at once, the pool's capacity is %d", most, jobsCapacity)
	}
	t.Logf("at most %d sandboxes at once (capacity %d)", most, jobsCapacity)
}
