package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
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

// countingRunner counts the rounds that reached Gitea.
type countingRunner struct{ declares int }

func (c *countingRunner) Declare(context.Context, []string) error { c.declares++; return nil }
func (c *countingRunner) FetchTask(context.Context) (*runnerv1.Task, error) {
	return nil, nil
}
func (c *countingRunner) Result(context.Context, int64) (runnerv1.Result, error) { return 0, nil }
func (c *countingRunner) Finalize(context.Context, int64, runnerv1.Result, string) error {
	return nil
}

func TestWebhookHandler(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	q, payloads := env.Queue, env.Payloads
	linux, gpu := &countingRunner{}, &countingRunner{}
	d := &dispatcher.Dispatcher{TrustDomain: spiffeid.RequireTrustDomainFromString("ci.example.org"), Queue: q, Payloads: payloads, KeepAlive: time.Minute}
	svc := newHTTPService(d, []dispatcher.Pool{
		{Pool: runnerpool.Pool{Name: "linux", Labels: []string{"ubuntu-latest"}, Backend: "pod", Capacity: 1}, Runner: linux, Tasks: linux},
		{Pool: runnerpool.Pool{Name: "gpu", Labels: []string{"ubuntu-latest", "gpu"}, Backend: "pod", Capacity: 1}, Runner: gpu, Tasks: gpu},
	}, []byte("s3cret"), function.Ticks{TickToken: "t1ck"}, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(svc.handler())
	defer srv.Close()

	delivery := func(job int, action string, labels string) []byte {
		return []byte(`{"action":"` + action + `","workflow_job":{"id":` + string(rune('0'+job)) + `,"labels":` + labels + `}}`)
	}
	send := func(event string, body []byte, sig string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/webhook", bytes.NewReader(body))
		req.Header.Set(webhook.HeaderEvent, event)
		if sig != "" {
			req.Header.Set(webhook.HeaderSignature, sig)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	sign := func(b []byte) string { return webhook.Sign([]byte("s3cret"), b) }
	gpuJob := delivery(1, "queued", `["ubuntu-latest","gpu"]`)
	for _, tc := range []struct {
		name               string
		event              string
		body               []byte
		sig                string
		wantCode           int
		wantLinux, wantGPU int
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
		if code != tc.wantCode || linux.declares != tc.wantLinux || gpu.declares != tc.wantGPU {
			t.Fatalf("%s: status %d (%s), rounds linux=%d gpu=%d; want %d, %d, %d",
				tc.name, code, body, linux.declares, gpu.declares, tc.wantCode, tc.wantLinux, tc.wantGPU)
		}
	}
	// A tick dispatches every pool, only with its token; a webhook over
	// webhook.MaxDelivery is 413.
	tick := func(header, value string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/", nil)
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
	if code := tick("", ""); code != http.StatusUnauthorized || linux.declares != 1 || gpu.declares != 2 {
		t.Fatalf("tick without its token: status %d, rounds linux=%d gpu=%d", code, linux.declares, gpu.declares)
	}
	if code := tick("Authorization", "Bearer guess"); code != http.StatusUnauthorized || linux.declares != 1 {
		t.Fatalf("tick with a wrong token: status %d, rounds linux=%d", code, linux.declares)
	}
	if code := tick("Authorization", "Bearer t1ck"); code != http.StatusAccepted || linux.declares != 2 || gpu.declares != 3 {
		t.Fatalf("tick: status %d, rounds linux=%d gpu=%d", code, linux.declares, gpu.declares)
	}
	if code := tick(function.HeaderTickToken, "t1ck"); code != http.StatusAccepted || linux.declares != 3 || gpu.declares != 4 {
		t.Fatalf("PingSource tick: status %d, rounds linux=%d gpu=%d", code, linux.declares, gpu.declares)
	}
	big := bytes.Repeat([]byte("x"), 2<<20)
	if code, _ := send("workflow_job", big, sign(big)); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("webhook of 2 MiB: status %d, want 413", code)
	}
}
