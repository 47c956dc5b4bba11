//go:build e2e

package knativepath

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

// module is the module path the functions are built from.
const module = "github.com/gitea-dynamic-runner/gitea-dynamic-runner"

const (
	trustDomain = "ci.example.org"
	poolName    = "knative"
)

// bins are the functions' binaries, built once by TestMain.
var bins struct {
	dispatch, handle, recover, gateway, runner string
}

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "gdr-knativepath-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		started := time.Now()
		if err := build(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if testing.Verbose() {
			fmt.Printf("knativepath: built the functions in %s\n", time.Since(started).Round(time.Millisecond))
		}
		return m.Run()
	}()
	os.Exit(code)
}

// build builds dispatch, handle, recover, gateway and runner into dir with
// one `go build`.
func build(dir string) error {
	names := []string{"dispatch", "handle", "recover", "gateway", "runner"}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, module+"/functions/"+n)
	}
	cmd := exec.Command(goTool(), args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	bins.dispatch, bins.handle, bins.recover = filepath.Join(dir, "dispatch"), filepath.Join(dir, "handle"), filepath.Join(dir, "recover")
	bins.gateway, bins.runner = filepath.Join(dir, "gateway"), filepath.Join(dir, "runner")
	return nil
}

// goTool is the go command: from PATH, else the toolchain that built the
// test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// env is one test's world: a Gitea with a repository, a NATS JetStream
// server, the keys, the local CA and the gateway, plus whichever of
// dispatch, handle and recover the test starts. Every server listens on
// 127.0.0.1. Processes are stopped when the test ends; when it failed, the
// tail of every log is printed.
type env struct {
	t     *testing.T
	dir   string
	logs  string
	gitea *giteaenv.Server
	repo  string

	natsURL string
	js      jetstream.JetStream

	td         spiffeid.TrustDomain
	signer     *assignmentsig.Signer
	payloadKey secretkey.Key
	tickToken  string
	processDir string
	caDir      string
	poolsFile  string
	stateDir   string
	gatewayURL string
	// handleURL and recoverURL are where handle and recover will listen,
	// chosen up front: the channel is started before them.
	handleURL, recoverURL string
	common                []string // every function's environment
	secretsEnv            map[string]string
	runnerLogMu           sync.Mutex

	mu    sync.Mutex
	procs []*proc
}

// proc is one function process.
type proc struct {
	name, log string
	url       string // its HTTP address, http://127.0.0.1:<port>
	p         *testenv.Process
}

// newEnv starts Gitea and NATS, registers the pool with Gitea (dispatch
// register) and prepares everything else: startDispatch (which also starts
// the gateway), startRecover and startHandle start the functions.
func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, dir: dir, logs: filepath.Join(dir, "logs"), td: spiffeid.RequireTrustDomainFromString(trustDomain),
		processDir: filepath.Join(dir, "executors"), caDir: filepath.Join(dir, "ca"), stateDir: filepath.Join(dir, "state"),
		poolsFile: filepath.Join(dir, "pools.yaml")}
	for _, d := range []string{e.logs, e.stateDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Registered first, so it runs last: after every process has stopped.
	t.Cleanup(e.report)

	e.gitea = giteaenv.Start(t, giteaenv.Options{ChannelQueue: true})
	e.repo = e.gitea.CreateRepo(t, "demo")
	_, e.natsURL = jetstreamenv.Start(t)
	_, e.js = jetstreamenv.Connect(t, e.natsURL)
	t.Cleanup(e.killExecutors) // before NATS and Gitea go: runners outlive handle

	if err := os.WriteFile(e.poolsFile, []byte("pools:\n  - name: "+poolName+"\n    labels: [ubuntu-latest]\n    backend: process\n    capacity: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	seed := randomKey(t, 32)
	signer, err := assignmentsig.NewSigner(seed)
	if err != nil {
		t.Fatal(err)
	}
	e.signer = signer
	e.payloadKey = randomKey(t, 32)
	e.tickToken = base64.RawURLEncoding.EncodeToString(randomKey(t, 24))
	b64 := base64.StdEncoding.EncodeToString
	e.secretsEnv = map[string]string{
		"GDR_PAYLOAD_KEY":            b64(e.payloadKey),
		"GDR_ASSIGNMENT_SIGNING_KEY": b64(seed),
		"GDR_BOOTSTRAP_KEY":          b64(randomKey(t, 32)),
		"GDR_TICK_TOKEN":             e.tickToken,
	}
	e.gatewayURL = "https://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	e.common = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GDR_LOG_LEVEL=debug",
		"GDR_NATS_URL=" + e.natsURL, "GDR_TRUST_DOMAIN=" + trustDomain, "GDR_POOLS_FILE=" + e.poolsFile,
		"GDR_STATE_DIR=" + e.stateDir, "GDR_GITEA_URL=" + e.gitea.URL, "GDR_GATEWAY_URL=" + e.gatewayURL,
		"GDR_ASSIGNMENT_VERIFY_KEYS=" + b64(signer.Public()),
		"GDR_CA_DIR=" + e.caDir, "GDR_PROCESS_DIR=" + e.processDir, "GDR_RUNNER_BIN=" + bins.runner,
	}

	e.secretsEnv["GDR_REGISTRATION_TOKEN"] = e.gitea.RegistrationToken(t)
	e.run("dispatch-register", bins.dispatch, []string{e.secret("GDR_REGISTRATION_TOKEN"),
		e.secret("GDR_PAYLOAD_KEY"), e.secret("GDR_ASSIGNMENT_SIGNING_KEY")}, "register")
	e.handleURL = "http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	e.recoverURL = "http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	e.keepRunnerLogs()
	return e
}

// secret returns the environment entry of one of the test's secrets.
func (e *env) secret(name string) string { return name + "=" + e.secretsEnv[name] }

// startGateway mints the gateway's SVID from the local CA that handle's
// process backend mints the executors' SVIDs from (GDR_CA_DIR), so each
// trusts the other, and starts the gateway with it.
func (e *env) startGateway() {
	t := e.t
	ca, err := svidca.LoadOrCreate(e.caDir, e.td)
	if err != nil {
		t.Fatal(err)
	}
	svid, err := ca.Mint(spiffeid.RequireFromPath(e.td, bootstrap.DefaultGatewayPath), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := svid.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	bundlePEM, err := ca.Bundle().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.dir, "gateway")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"svid.pem": certPEM, "svid-key.pem": keyPEM, "bundle.pem": bundlePEM}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	metrics := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	p := e.start("gateway", bins.gateway, []string{
		"GDR_HTTP_ADDR=" + strings.TrimPrefix(e.gatewayURL, "https://"), "GDR_METRICS_ADDR=" + metrics,
		e.secret("GDR_PAYLOAD_KEY"), e.secret("GDR_BOOTSTRAP_KEY"),
		"GDR_SVID_CERT=" + filepath.Join(dir, "svid.pem"), "GDR_SVID_KEY=" + filepath.Join(dir, "svid-key.pem"),
		"GDR_SVID_BUNDLE=" + filepath.Join(dir, "bundle.pem"),
	})
	p.url = "http://" + metrics
	e.waitHealthy(p)
}

// startHandle starts handle in http mode on the process backend, with
// extra environment over the common one, and returns it once it serves.
func (e *env) startHandle(extra ...string) *proc {
	p := e.start("handle", bins.handle, append([]string{
		"GDR_MODE=http", "GDR_BACKEND=process", "GDR_MAX_IN_FLIGHT=2", "GDR_HTTP_ADDR=" + strings.TrimPrefix(e.handleURL, "http://"),
		e.secret("GDR_BOOTSTRAP_KEY"),
	}, extra...))
	p.url = e.handleURL
	e.waitHealthy(p)
	return p
}

// startRecover starts recover in http mode with extra environment (how it
// re-sends orphans) and returns it once it serves. Its passes run on
// tick and ticking only. It needs the payload bucket: start it after
// dispatch.
func (e *env) startRecover(extra ...string) *proc {
	p := e.start("recover", bins.recover, append([]string{
		"GDR_RECOVER_MODE=http", "GDR_HTTP_ADDR=" + strings.TrimPrefix(e.recoverURL, "http://"), e.secret("GDR_TICK_TOKEN"), e.secret("GDR_PAYLOAD_KEY"),
		e.secret("GDR_ASSIGNMENT_SIGNING_KEY"), e.secret("GDR_BOOTSTRAP_KEY"),
	}, extra...))
	p.url = e.recoverURL
	e.waitHealthy(p)
	return p
}

// startDispatch starts dispatch serve polling Gitea every 500 ms, with
// extra environment (where it publishes), and returns it once it serves;
// then the gateway, which needs the payload bucket dispatch creates.
func (e *env) startDispatch(extra ...string) *proc {
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(e.t))
	p := e.start("dispatch", bins.dispatch, append([]string{
		"GDR_HTTP_ADDR=" + addr, "GDR_POLL_INTERVAL=500ms", "GDR_KEEPALIVE=10s", "GDR_ALLOW_UNSIGNED_WEBHOOKS=true",
		e.secret("GDR_TICK_TOKEN"), e.secret("GDR_PAYLOAD_KEY"), e.secret("GDR_ASSIGNMENT_SIGNING_KEY"),
	}, extra...), "serve")
	p.url = "http://" + addr
	e.waitHealthy(p)
	e.startGateway()
	return p
}

// start starts bin as name with the common environment and extra, its
// output in <logs>/<name>.log; it is stopped when the test ends.
func (e *env) start(name, bin string, extra []string, args ...string) *proc {
	t := e.t
	t.Helper()
	p, _, log := e.spawn(name, bin, extra, args...)
	pr := &proc{name: name, log: log, p: p}
	e.mu.Lock()
	e.procs = append(e.procs, pr)
	e.mu.Unlock()
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	return pr
}

// run runs bin as name to its end and fails the test unless it exits 0.
func (e *env) run(name, bin string, extra []string, args ...string) {
	t := e.t
	t.Helper()
	p, cmd, log := e.spawn(name, bin, extra, args...)
	select {
	case <-p.Exited():
	case <-time.After(time.Minute):
		p.Stop(time.Second)
		t.Fatalf("%s did not end within a minute:\n%s", name, testenv.LogTail(log, 30))
	}
	if !cmd.ProcessState.Success() {
		t.Fatalf("%s: %v:\n%s", name, cmd.ProcessState, testenv.LogTail(log, 30))
	}
}

// spawn starts bin as name with the common environment and extra in the
// test's folder, its output appended to <logs>/<name>.log (returned with the
// process and its command, whose ProcessState is set once it exited).
func (e *env) spawn(name, bin string, extra []string, args ...string) (*testenv.Process, *exec.Cmd, string) {
	t := e.t
	t.Helper()
	log := filepath.Join(e.logs, name+".log")
	logf, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Env = append(slices.Clone(e.common), extra...)
	cmd.Dir = e.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	p, err := testenv.StartProcess(cmd)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	return p, cmd, log
}

// waitHealthy waits until p answers GET /healthz with 200.
func (e *env) waitHealthy(p *proc) {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	if err := p.p.WaitReady(ctx, 50*time.Millisecond, func(ctx context.Context) error {
		resp, err := client.Get(p.url + "/healthz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("%s/healthz: %d %s", p.url, resp.StatusCode, bytes.TrimSpace(b))
		}
		return nil
	}); err != nil {
		t.Fatalf("%s is not ready: %v\n%s", p.name, err, testenv.LogTail(p.log, 40))
	}
}

// report fails the test if a log holds one of the test's secrets (naming
// the secret and the log, never the value), and prints the tail of every
// log when the test failed.
func (e *env) report() {
	paths, _ := filepath.Glob(filepath.Join(e.logs, "*.log"))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for name, value := range e.secretsEnv {
			if value != "" && bytes.Contains(data, []byte(value)) {
				e.t.Errorf("%s holds the value of %s", filepath.Base(p), name)
			}
		}
	}
	if !e.t.Failed() {
		return
	}
	for _, p := range paths {
		e.t.Logf("tail of %s:\n%s", filepath.Base(p), testenv.LogTail(p, 60))
	}
}

// keepRunnerLogs copies every executor's runner.log into the logs folder as
// it grows (recover deletes it with the executor), for report.
func (e *env) keepRunnerLogs() {
	stop := make(chan struct{})
	done := make(chan struct{})
	copyAll := func() {
		e.runnerLogMu.Lock()
		defer e.runnerLogMu.Unlock()
		paths, _ := filepath.Glob(filepath.Join(e.processDir, "*", "runner.log"))
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			dst := filepath.Join(e.logs, "runner-"+filepath.Base(filepath.Dir(p))+".log")
			if fi, err := os.Stat(dst); err == nil && fi.Size() >= int64(len(data)) {
				continue
			}
			_ = os.WriteFile(dst, data, 0o600)
		}
	}
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				copyAll()
				return
			case <-time.After(200 * time.Millisecond):
				copyAll()
			}
		}
	}()
	e.t.Cleanup(func() { close(stop); <-done })
}

// executorRecord is what the process backend keeps of an executor
// (executor.json): enough to count executors and to tell one process from
// another.
type executorRecord struct {
	Name string `json:"name"`
	PID  int    `json:"pid"`
}

// executors returns the process backend's executors by assignment ID.
func (e *env) executors() map[string]executorRecord {
	e.t.Helper()
	entries, err := os.ReadDir(e.processDir)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]executorRecord{}
	}
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]executorRecord{}
	for _, ent := range entries {
		if !ent.IsDir() {
			continue
		}
		var rec executorRecord
		if data, err := os.ReadFile(filepath.Join(e.processDir, ent.Name(), "executor.json")); err == nil {
			_ = json.Unmarshal(data, &rec)
		}
		out[ent.Name()] = rec
	}
	return out
}

// killExecutors ends the runners a test leaves: the process backend starts
// each in a process group of its own, which outlives handle. Only the
// groups of processes the test's handle recorded are signalled.
func (e *env) killExecutors() {
	for _, rec := range e.executors() {
		if rec.PID > 0 {
			_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
		}
	}
}

// payloadIDs returns the assignment IDs of the payloads in CI_TASKS (none
// while the bucket does not exist).
func (e *env) payloadIDs() []string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := assignmentqueue.OpenPayloads(ctx, e.js, assignmentqueue.DefaultPayloadBucket, e.payloadKey)
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil
		}
		e.t.Fatal(err)
	}
	ids, err := p.IDs(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// ticking ticks recover every interval until the test ends, as its
// PingSource does (every minute in the cluster): POST / with the token in
// Ce-Gdrtoken.
func (e *env) ticking(recover *proc, interval time.Duration) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		client := &http.Client{Timeout: time.Minute}
		for {
			select {
			case <-stop:
				return
			case <-time.After(interval):
			}
			req, err := http.NewRequest(http.MethodPost, recover.url+"/", strings.NewReader(`{"tick":"recover"}`))
			if err != nil {
				panic(err) // a constant request
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(function.HeaderTickToken, e.tickToken)
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}()
	e.t.Cleanup(func() { close(stop); <-done })
}

// waitFor polls cond every 100 ms until it holds, and fails the test with
// what after timeout.
func (e *env) waitFor(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitJob waits until the job named name is completed and returns it.
func (e *env) waitJob(name string, timeout time.Duration) giteaenv.Job {
	e.t.Helper()
	return e.gitea.WaitJob(e.t, e.repo, func(j giteaenv.Job) bool { return j.Name == name && j.Status == "completed" }, timeout)
}

func randomKey(t testing.TB, n int) secretkey.Key {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return secretkey.Key(b)
}
