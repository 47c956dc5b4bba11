package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/metricsenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// Local mode's webhook listener times the jobs Gitea tells it of, as
// dispatch serve does: a signed completed delivery of a job of its pool
// lands in its registry's push to running histogram.
func TestWebhookTimesJobs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	reg := metrics.NewRegistry()
	l := &local{cfg: Config{WebhookAddr: addr, WebhookSecret: "hook-secret"}, internal: slog.New(slog.DiscardHandler), reg: reg,
		pool: dispatcher.Pool{Pool: runnerpool.Pool{Name: "local", Labels: []string{"ubuntu-latest"}}}}
	if err := l.startWebhook(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.hook.Close() })
	body := `{"action":"completed","workflow_job":{"id":9,"labels":["ubuntu-latest"],"conclusion":"success",` +
		`"created_at":"2026-12-03T10:00:00Z","started_at":"2026-12-03T10:00:02Z","steps":[{"started_at":"2026-12-03T10:00:05Z"}]}}`
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/webhook", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(webhook.HeaderEvent, webhook.EventWorkflowJob)
	req.Header.Set(webhook.HeaderSignature, webhook.Sign([]byte("hook-secret"), []byte(body)))
	// startWebhook listens before it returns: no wait for the server.
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("delivery: %s", res.Status)
	}
	fams := metricsenv.Gather(t, reg)
	if v, ok := fams.Value("gdr_job_push_to_running_seconds", "pool", "local"); !ok || v != 1 {
		t.Fatalf("gdr_job_push_to_running_seconds{pool=local} count = %v (%v), want 1", v, ok)
	}
	if got := fmt.Sprint(fams["gdr_job_push_to_running_seconds"].GetMetric()[0].GetHistogram().GetSampleSum()); got != "5" {
		t.Errorf("push to running = %s s, want 5", got)
	}
}

// TestWebhookOldSecrets: local mode's webhook, like dispatch serve's, takes a delivery signed
// with GDR_WEBHOOK_SECRET or any of GDR_WEBHOOK_OLD_SECRETS (a rotation), and refuses any other
// signature; old secrets without a current one are a configuration error naming both.
func TestWebhookOldSecrets(t *testing.T) {
	body := `{"action":"queued","workflow_job":{"id":9,"labels":["windows"]}}` // no round: not the pool's
	for _, tc := range []struct {
		name, old, signedBy string
		want                int
	}{
		{"the current secret", "0ld-1,0ld-2", "hook-secret", http.StatusAccepted},
		{"an old secret listed", "0ld-1, 0ld-2", "0ld-2", http.StatusAccepted},
		{"no old secret", "", "0ld-2", http.StatusUnauthorized},
		{"another old secret listed", "0ld-1", "0ld-2", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			l := &local{cfg: Config{WebhookAddr: addr, WebhookSecret: "hook-secret", WebhookOldSecrets: tc.old}, internal: slog.New(slog.DiscardHandler),
				reg: metrics.NewRegistry(), pool: dispatcher.Pool{Pool: runnerpool.Pool{Name: "local", Labels: []string{"ubuntu-latest"}}}}
			if err := l.startWebhook(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.hook.Close() })
			req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/webhook", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(webhook.HeaderEvent, webhook.EventWorkflowJob)
			req.Header.Set(webhook.HeaderSignature, webhook.Sign([]byte(tc.signedBy), []byte(body)))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != tc.want {
				t.Fatalf("a delivery signed with %q: %s, want %d", tc.signedBy, res.Status, tc.want)
			}
		})
	}
	t.Setenv("GDR_WEBHOOK_OLD_SECRETS", "0ld-1")
	var c Config
	_, err := program.Load(&c, []string{"--gitea-url", "http://x"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "GDR_WEBHOOK_OLD_SECRETS is set but GDR_WEBHOOK_SECRET is empty") || strings.Contains(err.Error(), "0ld-1") {
		t.Fatalf("old secrets without the secret: %v", err)
	}
}
