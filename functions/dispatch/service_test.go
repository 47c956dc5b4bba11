package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// countingRunner counts the rounds that reached Gitea: each asks for a task
// once (Gitea has none), while Declare is sent once per process. With gate
// set, a round waits in FetchTask until gate is closed.
type countingRunner struct {
	declares atomic.Int64 // rounds: FetchTask calls
	gate     chan struct{}
}

func (c *countingRunner) Declare(context.Context, []string) error { return nil }

func (c *countingRunner) FetchTask(ctx context.Context) (*runnerv1.Task, error) {
	c.declares.Add(1)
	if c.gate == nil {
		return nil, nil
	}
	select {
	case <-c.gate:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (c *countingRunner) Result(context.Context, int64) (runnerv1.Result, error) { return 0, nil }
func (c *countingRunner) Finalize(context.Context, int64, runnerv1.Result, string) error {
	return nil
}

// testService is a service of two pools, linux (ubuntu-latest) and gpu
// (ubuntu-latest, gpu), on a JetStream of the test's own, served over HTTP.
type testService struct {
	svc        *service
	url        string
	linux, gpu *countingRunner
}

func newTestService(t *testing.T, linux, gpu *countingRunner) testService {
	t.Helper()
	return newPacedTestService(t, linux, gpu, nil)
}

// newPacedTestService is newTestService whose serve polls at cadence's pace.
func newPacedTestService(t *testing.T, linux, gpu *countingRunner, cadence *dispatcher.Cadence) testService {
	t.Helper()
	return newSignedTestService(t, linux, gpu, cadence, []byte("s3cret"), nil)
}

// newSignedTestService is newPacedTestService whose webhook takes deliveries signed with secret
// or any of oldSecrets.
func newSignedTestService(t *testing.T, linux, gpu *countingRunner, cadence *dispatcher.Cadence, secret []byte, oldSecrets [][]byte) testService {
	t.Helper()
	env := jetstreamenv.NewQueue(t)
	d := &dispatcher.Dispatcher{TrustDomain: spiffeid.RequireTrustDomainFromString("ci.example.org"), Queue: env.Queue, Payloads: env.Payloads, KeepAlive: time.Minute}
	svc := newHTTPService(t.Context(), d, []dispatcher.Pool{
		{Pool: runnerpool.Pool{Name: "linux", Labels: []string{"ubuntu-latest"}, Backend: "pod", Capacity: 1}, Registration: linux, Tasks: linux},
		{Pool: runnerpool.Pool{Name: "gpu", Labels: []string{"ubuntu-latest", "gpu"}, Backend: "pod", Capacity: 1}, Registration: gpu, Tasks: gpu},
	}, secret, oldSecrets, function.TickSettings{TickToken: "t1ck"}, cadence, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(svc.handler())
	t.Cleanup(srv.Close)
	return testService{svc: svc, url: srv.URL, linux: linux, gpu: gpu}
}

// delivery is the body of a workflow_job delivery.
func delivery(job int, action string, labels string) []byte {
	return []byte(`{"action":"` + action + `","workflow_job":{"id":` + strconv.Itoa(job) + `,"labels":` + labels + `}}`)
}

func sign(b []byte) string { return webhook.Sign([]byte("s3cret"), b) }

// send posts a delivery to the webhook and returns the answer.
func (ts testService) send(t *testing.T, event string, body []byte, sig string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, ts.url+"/webhook", bytes.NewReader(body))
	req.Header.Set(webhook.HeaderEvent, event)
	if sig != "" {
		req.Header.Set(webhook.HeaderSignature, sig)
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// rounds waits until the pools have had linux and gpu rounds (they run
// after the answer), and fails the test if they do not within 5 s.
func (ts testService) rounds(t *testing.T, linux, gpu int64) bool {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for ts.linux.declares.Load() != linux || ts.gpu.declares.Load() != gpu {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

func TestWebhookHandler(t *testing.T) {
	ts := newTestService(t, &countingRunner{}, &countingRunner{})
	linux, gpu := ts.linux, ts.gpu
	send := func(event string, body []byte, sig string) (int, string) { return ts.send(t, event, body, sig) }
	gpuJob := delivery(1, "queued", `["ubuntu-latest","gpu"]`)
	for _, tc := range []struct {
		name               string
		event              string
		body               []byte
		sig                string
		wantCode           int
		wantLinux, wantGPU int64
	}{
		{"unsigned", "workflow_job", gpuJob, "", http.StatusUnauthorized, 0, 0},
		{"forged", "workflow_job", gpuJob, webhook.Sign([]byte("guess"), gpuJob), http.StatusUnauthorized, 0, 0},
		{"another event", "push", []byte(`{}`), sign([]byte(`{}`)), http.StatusAccepted, 0, 0},
		{"not a job", "workflow_job", []byte(`{"action":"queued"}`), sign([]byte(`{"action":"queued"}`)), http.StatusBadRequest, 0, 0},
		{"completed", "workflow_job", delivery(2, "completed", `["ubuntu-latest"]`), sign(delivery(2, "completed", `["ubuntu-latest"]`)), http.StatusAccepted, 0, 0},
		{"queued for gpu only", "workflow_job", gpuJob, sign(gpuJob), http.StatusAccepted, 0, 1},
		{"duplicate", "workflow_job", gpuJob, sign(gpuJob), http.StatusAccepted, 0, 1},
		{"queued for both", "workflow_job", delivery(3, "queued", `["ubuntu-latest"]`), sign(delivery(3, "queued", `["ubuntu-latest"]`)), http.StatusAccepted, 1, 2},
		{"no pool matches", "workflow_job", delivery(4, "queued", `["windows"]`), sign(delivery(4, "queued", `["windows"]`)), http.StatusAccepted, 1, 2},
	} {
		code, body := send(tc.event, tc.body, tc.sig)
		if code != tc.wantCode || !ts.rounds(t, tc.wantLinux, tc.wantGPU) {
			t.Fatalf("%s: status %d (%s), rounds linux=%d gpu=%d; want %d, %d, %d",
				tc.name, code, body, linux.declares.Load(), gpu.declares.Load(), tc.wantCode, tc.wantLinux, tc.wantGPU)
		}
	}
	// A tick dispatches every pool, only with its token; a webhook over
	// webhook.MaxDelivery is 413.
	tick := func(header, value string) int {
		req, _ := http.NewRequest(http.MethodPost, ts.url+"/", nil)
		if header != "" {
			req.Header.Set(header, value)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name               string
		header, value      string
		wantCode           int
		wantLinux, wantGPU int64
	}{
		{"tick without its token", "", "", http.StatusUnauthorized, 1, 2},
		{"tick with a wrong token", "Authorization", "Bearer guess", http.StatusUnauthorized, 1, 2},
		{"tick", "Authorization", "Bearer t1ck", http.StatusAccepted, 2, 3},
		{"PingSource tick", function.HeaderTickToken, "t1ck", http.StatusAccepted, 3, 4},
	} {
		if code := tick(tc.header, tc.value); code != tc.wantCode || !ts.rounds(t, tc.wantLinux, tc.wantGPU) {
			t.Fatalf("%s: status %d, rounds linux=%d gpu=%d; want %d, %d, %d",
				tc.name, code, linux.declares.Load(), gpu.declares.Load(), tc.wantCode, tc.wantLinux, tc.wantGPU)
		}
	}
	big := bytes.Repeat([]byte("x"), 2<<20)
	if code, _ := send("workflow_job", big, sign(big)); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("webhook of 2 MiB: status %d, want 413", code)
	}
}

// The webhook answers as soon as a delivery is verified and matched: a round
// that hangs (a slow Gitea) does not hold the answer back past Gitea's 5 s
// delivery timeout, and the round runs on.
func TestWebhookAnswersBeforeTheRound(t *testing.T) {
	gate := make(chan struct{})
	defer close(gate)
	ts := newTestService(t, &countingRunner{gate: gate}, &countingRunner{gate: gate})
	job := delivery(1, "queued", `["ubuntu-latest"]`)
	start := time.Now()
	if code, body := ts.send(t, webhook.EventWorkflowJob, job, sign(job)); code != http.StatusAccepted {
		t.Fatalf("status %d (%s), want 202", code, body)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the answer took %v: it waited for the round", took)
	}
	if !ts.rounds(t, 1, 1) {
		t.Fatalf("rounds linux=%d gpu=%d, want one each, running", ts.linux.declares.Load(), ts.gpu.declares.Load())
	}
}

// Deliveries and ticks that arrive during a pool's round wake exactly one
// more round of it after that round, however many there are; a pool whose
// round is not running is not held up by another's.
func TestWakeUpsDuringARoundCoalesce(t *testing.T) {
	gate := make(chan struct{})
	ts := newTestService(t, &countingRunner{}, &countingRunner{gate: gate})
	gpuJob := func(id int) []byte { return delivery(id, "queued", `["ubuntu-latest","gpu"]`) }
	if code, _ := ts.send(t, webhook.EventWorkflowJob, gpuJob(1), sign(gpuJob(1))); code != http.StatusAccepted || !ts.rounds(t, 0, 1) {
		t.Fatalf("first delivery: status %d, rounds gpu=%d", code, ts.gpu.declares.Load())
	}
	for id := 2; id <= 6; id++ {
		if code, _ := ts.send(t, webhook.EventWorkflowJob, gpuJob(id), sign(gpuJob(id))); code != http.StatusAccepted {
			t.Fatalf("delivery %d during the round: status %d", id, code)
		}
	}
	both := delivery(7, "queued", `["ubuntu-latest"]`)
	if code, _ := ts.send(t, webhook.EventWorkflowJob, both, sign(both)); code != http.StatusAccepted || !ts.rounds(t, 1, 1) {
		t.Fatalf("delivery for both pools: status %d, rounds linux=%d gpu=%d", code, ts.linux.declares.Load(), ts.gpu.declares.Load())
	}
	close(gate)
	if !ts.svc.rounds.Wait(5 * time.Second) {
		t.Fatal("rounds still running 5 s after the gate opened")
	}
	if got := ts.gpu.declares.Load(); got != 2 {
		t.Fatalf("gpu had %d rounds, want 2: the one running and one for the 6 wake-ups during it", got)
	}
}

// serve polls each pool at its own pace: right away, then a pool a webhook
// named is busy and polled every Busy, while the other waits its Idle.
func TestServePacesEachPool(t *testing.T) {
	ts := newPacedTestService(t, &countingRunner{}, &countingRunner{},
		&dispatcher.Cadence{Idle: 2 * time.Second, Busy: 10 * time.Millisecond, Window: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- ts.svc.serve(ctx, "127.0.0.1:0") }()
	if !ts.rounds(t, 1, 1) {
		t.Fatalf("rounds linux=%d gpu=%d, want one each at start", ts.linux.declares.Load(), ts.gpu.declares.Load())
	}
	gpuJob := delivery(1, "queued", `["ubuntu-latest","gpu"]`)
	if code, body := ts.send(t, webhook.EventWorkflowJob, gpuJob, sign(gpuJob)); code != http.StatusAccepted {
		t.Fatalf("status %d (%s), want 202", code, body)
	}
	time.Sleep(500 * time.Millisecond)
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if linux, gpu := ts.linux.declares.Load(), ts.gpu.declares.Load(); linux != 1 || gpu < 5 {
		t.Fatalf("in 0.5 s rounds linux=%d gpu=%d, want linux 1 (idle: every 2 s) and gpu at least 5 (busy: every 10 ms)", linux, gpu)
	}
}

// TestWebhookOldSecrets: a webhook secret rotation. dispatch serve reads GDR_WEBHOOK_OLD_SECRETS
// and takes a delivery signed with GDR_WEBHOOK_SECRET or any listed old secret (Gitea signs
// with the one its webhook has: the old one until it is changed), and refuses any other.
func TestWebhookOldSecrets(t *testing.T) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	job := delivery(1, "queued", `["ubuntu-latest"]`)
	for _, tc := range []struct {
		name, old, signedBy string
		want                int
	}{
		{"the current secret", "0ld-1,0ld-2", "s3cret", http.StatusAccepted},
		{"an old secret listed", "0ld-1, 0ld-2", "0ld-2", http.StatusAccepted},
		{"the current secret, no old one", "", "s3cret", http.StatusAccepted},
		{"no old secret", "", "0ld-2", http.StatusUnauthorized},
		{"another old secret listed", "0ld-1", "0ld-2", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range map[string]string{
				"GDR_GITEA_URL": "http://127.0.0.1:3000/", "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir,
				"GDR_TRUST_DOMAIN": "ci.example.org", "GDR_PAYLOAD_KEY": testKey,
				"GDR_ASSIGNMENT_SIGNING_KEY": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=",
				"GDR_WEBHOOK_SECRET":         "s3cret", "GDR_WEBHOOK_OLD_SECRETS": tc.old,
			} {
				t.Setenv(k, v)
			}
			cfg, err := loadConfig()
			if err != nil {
				t.Fatal(err)
			}
			secret, oldSecrets := cfg.webhookSecrets()
			ts := newSignedTestService(t, &countingRunner{}, &countingRunner{}, nil, secret, oldSecrets)
			if code, body := ts.send(t, webhook.EventWorkflowJob, job, webhook.Sign([]byte(tc.signedBy), job)); code != tc.want {
				t.Fatalf("a delivery signed with %q: %d (%s), want %d", tc.signedBy, code, body, tc.want)
			}
		})
	}
}
