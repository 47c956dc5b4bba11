package main

import (
	"fmt"
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
