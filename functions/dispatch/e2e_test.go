//go:build e2e

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

const (
	payloadKey    = "cGF5bG9hZC1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=" // 32 bytes, base64
	webhookSecret = "e2e-hook-secret"
)

func workflow(jobs ...string) string {
	var b strings.Builder
	b.WriteString("name: ci\non: [push]\njobs:\n")
	for _, j := range jobs {
		fmt.Fprintf(&b, "  %s:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo %s\n", j, j)
	}
	return b.String()
}

// e2e is one Gitea, one NATS server and dispatch configured for one pool
// ("linux", labels ubuntu-latest, backend process) registered with Gitea.
type e2e struct {
	gitea    *giteaenv.Server
	repo     string
	js       jetstream.JetStream
	nc       *nats.Conn
	consumer jetstream.Consumer
	svc      *service
	cfg      Config
	logs     *bytes.Buffer
}

func setup(t *testing.T, capacity int, opts giteaenv.Options) *e2e {
	t.Helper()
	opts.ChannelQueue = true
	return setupWith(t, capacity, opts)
}

func setupWith(t testing.TB, capacity int, opts giteaenv.Options) *e2e {
	t.Helper()
	return setupClient(t, capacity, opts, &http.Client{Timeout: 30 * time.Second}, nil)
}

// setupClient is setupWith with dispatch's HTTP client to Gitea hc, and env
// set over the test's defaults (GDR_* variables).
func setupClient(t testing.TB, capacity int, opts giteaenv.Options, hc *http.Client, env map[string]string) *e2e {
	t.Helper()
	g := giteaenv.Start(t, opts)
	e := &e2e{gitea: g, repo: g.CreateRepo(t, "demo"), logs: &bytes.Buffer{}}
	_, url := jetstreamenv.Start(t)
	e.nc, e.js = jetstreamenv.Connect(t, url)
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte(fmt.Sprintf(
		"pools:\n  - name: linux\n    labels: [ubuntu-latest]\n    backend: process\n    capacity: %d\n", capacity)), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"GDR_GITEA_URL": g.URL, "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": filepath.Join(dir, "state"),
		"GDR_NATS_URL": url, "GDR_TRUST_DOMAIN": "ci.example.org", "GDR_PAYLOAD_KEY": payloadKey,
		"GDR_ASSIGNMENT_SIGNING_KEY": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=",
		"GDR_WEBHOOK_SECRET":         webhookSecret, "GDR_REGISTRATION_TOKEN": g.RegistrationToken(t),
		"GDR_KEEPALIVE": "5s",
	} {
		t.Setenv(k, v)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	ctx := context.Background()
	if code := execute(ctx, []string{"register"}, os.Stderr); code != 0 {
		t.Fatalf("dispatch register exited %d", code)
	}
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	ps := cfg.pools
	e.cfg = cfg
	log := slog.New(slog.NewTextHandler(&syncWriter{w: e.logs}, nil))
	svc, closeFn, err := newService(ctx, cfg, ps, hc, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeFn)
	e.svc = svc
	e.consumer, err = assignmentqueue.New(e.js, "").OpenConsumer(ctx, taskassignment.BackendProcess, 100)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// published drains the backend's queue and returns the assignments in it.
// publishedWithin is published for assignments that a background round (a
// webhook's) publishes: it fetches until want have come or timeout passes, and
// then once more, so that one too many is seen too.
func (e *e2e) publishedWithin(t *testing.T, want int, timeout time.Duration) []taskassignment.Assignment {
	t.Helper()
	var out []taskassignment.Assignment
	for deadline := time.Now().Add(timeout); len(out) < want && time.Now().Before(deadline); {
		out = append(out, e.published(t)...)
	}
	return append(out, e.published(t)...)
}

func (e *e2e) published(t *testing.T) []taskassignment.Assignment {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	var out []taskassignment.Assignment
	batch, err := e.consumer.Fetch(100, jetstream.FetchMaxWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := e.cfg.Signer()
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		msg, err := signer.Open(m.Data()) // as handle authenticates it
		if err != nil {
			t.Fatalf("published message is not signed by dispatch's key: %v", err)
		}
		a, err := taskassignment.Decode(msg, td)
		if err != nil {
			t.Fatalf("published message does not decode: %v", err)
		}
		_ = m.Ack()
		out = append(out, a)
	}
	return out
}

// claim pushes a workflow of jobs to the repository, waits for them to be
// queued, runs a round and returns the assignments it published, one per job.
func (e *e2e) claim(t *testing.T, jobs ...string) []taskassignment.Assignment {
	t.Helper()
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml", workflow(jobs...))
	e.waitQueued(t, len(jobs))
	if err := e.svc.dispatchAll(context.Background(), e.svc.pools); err != nil {
		t.Fatal(err)
	}
	as := e.published(t)
	if len(as) != len(jobs) {
		t.Fatalf("published %d assignments, want %d", len(as), len(jobs))
	}
	return as
}

func (e *e2e) waitQueued(t *testing.T, n int) []giteaenv.Job {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var queued []giteaenv.Job
		for _, j := range e.gitea.Jobs(t, e.repo) {
			if j.Status == "queued" {
				queued = append(queued, j)
			}
		}
		if len(queued) >= n {
			return queued
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d jobs queued in Gitea, want %d", len(queued), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *e2e) statuses(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, j := range e.gitea.Jobs(t, e.repo) {
		out[j.Name] = j.Status + "/" + j.Conclusion
	}
	return out
}

func (e *e2e) pool(t *testing.T) dispatcher.Pool {
	t.Helper()
	if len(e.svc.pools) != 1 {
		t.Fatalf("%d pools", len(e.svc.pools))
	}
	return e.svc.pools[0]
}

func TestE2EDispatchClaimsAPushedJob(t *testing.T) {
	e := setup(t, 5, giteaenv.Options{})
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml", workflow("build"))
	e.waitQueued(t, 1)
	if err := e.svc.dispatchAll(context.Background(), e.svc.pools); err != nil {
		t.Fatal(err)
	}
	as := e.published(t)
	if len(as) != 1 {
		t.Fatalf("published %d assignments, want 1", len(as))
	}
	a := as[0]
	owner, name, _ := strings.Cut(e.repo, "/")
	wantID := fmt.Sprintf("spiffe://ci.example.org/repo/%s/%s/task/%d", strings.ToLower(owner), strings.ToLower(name), a.Task.ID)
	if a.Identity.Repository != e.repo || a.Identity.Task != "build" || a.Identity.SPIFFEID != wantID || a.Task.Pool != "linux" {
		t.Fatalf("assignment = %+v, want repository %s, job build, SPIFFE ID %s", a, e.repo, wantID)
	}
	if got := e.statuses(t)["build"]; got != "in_progress/" {
		t.Fatalf("Gitea shows the job as %q, want claimed (in_progress)", got)
	}
	// The payload is the whole task, secrets included, sealed.
	payloads, err := assignmentqueue.EnsurePayloads(context.Background(), e.js, assignmentqueue.Bucket{Name: "CI_TASKS", TTL: time.Hour}, e.cfg.PayloadKey)
	if err != nil {
		t.Fatal(err)
	}
	task, err := payloads.Get(context.Background(), a.ID)
	if err != nil || task.GetId() != a.Task.ID || task.GetSecrets()["GITEA_TOKEN"] == "" {
		t.Fatalf("payload = %v, %v", task, err)
	}
}

func TestE2ECapacityIsRespected(t *testing.T) {
	e := setup(t, 2, giteaenv.Options{})
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml", workflow("a", "b", "c"))
	e.waitQueued(t, 3)
	if err := e.svc.dispatchAll(context.Background(), e.svc.pools); err != nil {
		t.Fatal(err)
	}
	if as := e.published(t); len(as) != 2 {
		t.Fatalf("published %d, want 2", len(as))
	}
	// A second round finds the pool full (the two payloads are in flight).
	if err := e.svc.dispatchAll(context.Background(), e.svc.pools); err != nil {
		t.Fatal(err)
	}
	if as := e.published(t); len(as) != 0 {
		t.Fatalf("a full pool published %d more", len(as))
	}
	claimed, queued := 0, 0
	for _, s := range e.statuses(t) {
		switch s {
		case "in_progress/":
			claimed++
		case "queued/":
			queued++
		}
	}
	if claimed != 2 || queued != 1 {
		t.Fatalf("Gitea: %v", e.statuses(t))
	}
}

func TestE2EWebhook(t *testing.T) {
	e := setup(t, 5, giteaenv.Options{})
	srv := httptest.NewServer(e.svc.handler())
	defer srv.Close()
	var (
		mu         sync.Mutex
		deliveries [][]byte
		forward    = true
	)
	// Record what Gitea delivers, then hand it to dispatch.
	recorder := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := new(bytes.Buffer)
		_, _ = body.ReadFrom(r.Body)
		mu.Lock()
		deliveries = append(deliveries, body.Bytes())
		on := forward
		mu.Unlock()
		if !on {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		r.Body = httpBody(body.Bytes())
		e.svc.handler().ServeHTTP(w, r)
	}))
	defer recorder.Close()
	e.gitea.AddSystemWebhook(t, recorder.URL+"/webhook", webhookSecret)

	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml", workflow("build"))
	e.gitea.WaitJob(t, e.repo, func(j giteaenv.Job) bool { return j.Status == "in_progress" }, 20*time.Second)
	// The job shows in_progress once claimed, a moment before the round
	// (in the background) has published it.
	if as := e.publishedWithin(t, 1, 10*time.Second); len(as) != 1 {
		t.Fatalf("the webhook published %d assignments, want 1", len(as))
	}

	// The same queued delivery again (Gitea repeats them) claims nothing,
	// even with another job waiting.
	var queued []byte
	mu.Lock()
	forward = false
	for _, d := range deliveries {
		if j, err := webhook.Parse(d); err == nil && j.Action == webhook.ActionQueued {
			queued = d
		}
	}
	mu.Unlock()
	if queued == nil {
		t.Fatal("no queued delivery recorded")
	}
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/other.yml", workflow("other"))
	e.waitQueued(t, 1)
	if code := post(t, srv.URL+"/webhook", queued, webhook.Sign([]byte(webhookSecret), queued)); code != http.StatusAccepted {
		t.Fatalf("duplicate delivery: status %d", code)
	}
	if as := e.published(t); len(as) != 0 {
		t.Fatalf("a duplicate delivery published %d assignments", len(as))
	}
}

func TestE2EBadSignatureClaimsNothing(t *testing.T) {
	e := setup(t, 5, giteaenv.Options{})
	srv := httptest.NewServer(e.svc.handler())
	defer srv.Close()
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml", workflow("build"))
	jobs := e.waitQueued(t, 1)
	body := []byte(fmt.Sprintf(`{"action":"queued","workflow_job":{"id":%d,"run_id":%d,"labels":["ubuntu-latest"]}}`, jobs[0].ID, jobs[0].RunID))
	for _, sig := range []string{"", webhook.Sign([]byte("wrong-secret"), body)} {
		if code := post(t, srv.URL+"/webhook", body, sig); code != http.StatusUnauthorized {
			t.Fatalf("signature %q: status %d, want 401", sig, code)
		}
	}
	if as := e.published(t); len(as) != 0 {
		t.Fatalf("published %d", len(as))
	}
	if got := e.statuses(t)["build"]; got != "queued/" {
		t.Fatalf("job is %q after forged deliveries, want still queued", got)
	}
}

func TestE2EGiteaDownClaimsNothing(t *testing.T) {
	e := setup(t, 5, giteaenv.Options{})
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml", workflow("build"))
	e.waitQueued(t, 1)
	e.gitea.Stop(t)
	err := e.svc.dispatchAll(context.Background(), e.svc.pools)
	if err == nil {
		t.Fatal("dispatch with Gitea down succeeded")
	}
	if as := e.published(t); len(as) != 0 {
		t.Fatalf("published %d with Gitea down", len(as))
	}
	e.gitea.Restart(t)
	if got := e.statuses(t)["build"]; got != "queued/" {
		t.Fatalf("job is %q, want still queued", got)
	}
}

func TestE2EUnknownPoolIsAConfigError(t *testing.T) {
	e := setup(t, 1, giteaenv.Options{})
	_ = e
	if code := execute(context.Background(), []string{"run", "-pool", "windows"}, os.Stderr); code != 2 {
		t.Fatalf("dispatch run -pool windows exited %d, want 2", code)
	}
}

func TestE2ERegisterWithWrongToken(t *testing.T) {
	e := setup(t, 1, giteaenv.Options{})
	t.Setenv("GDR_STATE_DIR", t.TempDir())
	t.Setenv("GDR_REGISTRATION_TOKEN", "not-a-token")
	_ = e
	if code := execute(context.Background(), []string{"register"}, os.Stderr); code != 1 {
		t.Fatalf("register with a wrong token exited %d, want 1", code)
	}
}

func TestE2ETerminalAndReport(t *testing.T) {
	e := setup(t, 5, giteaenv.Options{})
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml", workflow("build"))
	e.waitQueued(t, 1)
	if err := e.svc.dispatchAll(context.Background(), e.svc.pools); err != nil {
		t.Fatal(err)
	}
	as := e.published(t)
	if len(as) != 1 {
		t.Fatalf("published %d", len(as))
	}
	ts := e.pool(t).Tasks.(gitea.TaskState)
	ctx := context.Background()
	id := as[0].Task.ID
	if terminal, err := ts.Terminal(ctx, id); err != nil || terminal {
		t.Fatalf("Terminal of a claimed task = %v, %v", terminal, err)
	}
	// The backend's reason (a Pod stuck on its image) reaches the job's log.
	reason := `container runner: ImagePullBackOff: Back-off pulling image "registry.invalid/nope:1"`
	if err := ts.Report(ctx, id, executor.Executor{Phase: "failed", Reason: reason}); err != nil {
		t.Fatal(err)
	}
	job := e.gitea.WaitJob(t, e.repo, func(j giteaenv.Job) bool { return j.Status == "completed" }, 10*time.Second)
	if job.Conclusion != "failure" {
		t.Fatalf("job = %+v, want a failure", job)
	}
	if logs := e.gitea.JobLogs(t, e.repo, job.ID); !strings.Contains(logs, reason) || !strings.Contains(logs, "the job is marked failed") {
		t.Fatalf("job log does not say why:\n%s", logs)
	}
	if terminal, err := ts.Terminal(ctx, id); err != nil || !terminal {
		t.Fatalf("Terminal of a reported task = %v, %v", terminal, err)
	}
	// Idempotent: a second report changes nothing and does not fail.
	if err := ts.Report(ctx, id, executor.Executor{Phase: "succeeded"}); err != nil {
		t.Fatal(err)
	}
	if r, err := ts.Result(ctx, id); err != nil || r != runnerv1.Result_RESULT_FAILURE {
		t.Fatalf("Result after a second report = %v, %v", r, err)
	}
}

// Two claimed tasks under a 1-minute ZOMBIE_TASK_TIMEOUT: the one dispatch
// keeps alive outlives it; the other (marked started, so dispatch leaves it
// to an executor that never comes) is failed by Gitea's reaper.
func TestE2EKeepAliveOutlivesTheZombieTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("takes about 90 s")
	}
	e := setup(t, 5, giteaenv.Options{ZombieTaskTimeout: time.Minute, ZombieSchedule: "@every 5s"})
	as := e.claim(t, "kept", "dropped")
	ctx := context.Background()
	payloads, err := assignmentqueue.EnsurePayloads(ctx, e.js, assignmentqueue.Bucket{Name: "CI_TASKS", TTL: time.Hour}, e.cfg.PayloadKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if a.Identity.Task == "dropped" {
			if err := payloads.MarkStarted(ctx, a.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(100 * time.Second)
	for {
		if err := e.svc.dispatchAll(ctx, e.svc.pools); err != nil {
			t.Fatal(err)
		}
		st := e.statuses(t)
		if st["kept"] != "in_progress/" {
			t.Fatalf("the kept-alive task ended: %v", st)
		}
		if st["dropped"] == "completed/failure" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unattended task was never reaped: %v", st)
		}
		time.Sleep(5 * time.Second)
	}
	// The reaper had a full timeout to take the kept task too, and did not.
	if st := e.statuses(t); st["kept"] != "in_progress/" {
		t.Fatalf("statuses = %v", st)
	}
}

// A waiting task whose repository is deleted: Gitea answers its heartbeat
// "resource does not exist". The round drops it and goes on to claim the
// next job, which only the freed slot lets in (capacity 1).
func TestE2EKeepAliveDropsATaskWhoseRepositoryIsDeleted(t *testing.T) {
	e := setup(t, 1, giteaenv.Options{})
	doomed := e.claim(t, "doomed")
	ctx := context.Background()
	if code := e.gitea.Do(t, http.MethodDelete, "/repos/"+e.repo, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete repository: status %d", code)
	}
	e.repo = e.gitea.CreateRepo(t, "next")
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml", workflow("next"))
	e.waitQueued(t, 1)
	e.svc.d.KeepAlive = time.Nanosecond // the doomed task is due
	if err := e.svc.dispatchAll(ctx, e.svc.pools); err != nil {
		t.Fatalf("the round failed on the deleted task: %v", err)
	}
	if as := e.published(t); len(as) != 1 || as[0].Identity.Task != "next" {
		t.Fatalf("published %+v, want the next job", as)
	}
	payloads, err := assignmentqueue.OpenPayloads(ctx, e.js, "CI_TASKS", e.cfg.PayloadKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := payloads.Get(ctx, doomed[0].ID); !errors.Is(err, taskassignment.ErrPayloadNotFound) {
		t.Fatalf("payload of the deleted repository's task: %v, want it dropped", err)
	}
}

func post(t *testing.T, url string, body []byte, signature string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(webhook.HeaderEvent, webhook.EventWorkflowJob)
	req.Header.Set("Content-Type", "application/json")
	if signature != "" {
		req.Header.Set(webhook.HeaderSignature, signature)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

func httpBody(b []byte) readCloser { return readCloser{bytes.NewReader(b)} }
