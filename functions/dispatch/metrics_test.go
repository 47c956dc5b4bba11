package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics/dispatchmetrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

// oneTaskRunner hands out one task, then none.
type oneTaskRunner struct {
	countingRunner
	task   *runnerv1.Task
	handed atomic.Bool
}

func (r *oneTaskRunner) FetchTask(context.Context) (*runnerv1.Task, error) {
	if r.handed.Swap(true) {
		return nil, nil
	}
	return r.task, nil
}

// A tick drives a round that claims a task: /metrics then counts the round,
// the claim and its pickup, and shows the pod consumer's lag (the published
// assignment). Per-task values (repository, token) are never in a label.
func TestMetricsCountARound(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	env.OpenConsumer(t, "pod", 3)
	taskCtx, err := structpb.NewStruct(map[string]any{"repository": "alice/secret-project", "job": "build", "token": "task-token-s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	runner := &oneTaskRunner{task: &runnerv1.Task{Id: 7, Context: taskCtx,
		WorkflowPayload: []byte("name: ci\non: push\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo hi\n")}}
	reg := metrics.NewRegistry()
	d := &dispatcher.Dispatcher{TrustDomain: spiffeid.RequireTrustDomainFromString("ci.example.org"), Queue: env.Queue, Payloads: env.Payloads,
		KeepAlive: time.Minute, Observer: dispatchmetrics.NewDispatch(reg)}
	pools := runnerpool.Pools{{Name: "linux", Labels: []string{"ubuntu-latest"}, Backend: "pod", Capacity: 3}}
	reg.MustRegister(metrics.NewConsumers(metrics.JetStreamConsumerInfo(env.JetStream), env.Queue.Stream(), consumersOf(pools), nil))
	svc := newHTTPService(t.Context(), d, []dispatcher.Pool{{Pool: pools[0], Registration: runner, Tasks: runner}},
		nil, nil, function.TickSettings{TickToken: "t1ck"}, nil, slog.New(slog.DiscardHandler))
	svc.metrics = reg
	srv := httptest.NewServer(svc.handler())
	t.Cleanup(srv.Close)

	scrape := func() metrics.Families {
		t.Helper()
		fams, err := metrics.Scrape(t.Context(), srv.Client(), srv.URL+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		return fams
	}
	before := scrape()
	if v, _ := before.Value("gdr_dispatch_rounds_total", "pool", "linux", "result", "ok"); v != 0 {
		t.Fatalf("rounds before any tick = %v", v)
	}
	if v, ok := before.Value("gdr_consumer_pending_messages", "consumer", "pod"); !ok || v != 0 {
		t.Fatalf("pod consumer pending before the round = %v (%v), want 0", v, ok)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/", nil)
	req.Header.Set("Authorization", "Bearer t1ck")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !svc.rounds.Wait(5 * time.Second) {
		t.Fatal("the round did not end")
	}
	after := scrape()
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"gdr_dispatch_rounds_total", []string{"pool", "linux", "result", "ok"}, 1},
		{"gdr_dispatch_tasks_claimed_total", []string{"pool", "linux"}, 1},
		{"gdr_dispatch_pickup_seconds", []string{"pool", "linux"}, 1}, // one observation
		{"gdr_dispatch_tasks_in_flight", []string{"pool", "linux"}, 1},
		{"gdr_consumer_info_up", []string{"consumer", "pod"}, 1},
	} {
		if v, ok := after.Value(want.name, want.labels...); !ok || v != want.value {
			t.Errorf("%s%v = %v (present %v), want %v", want.name, want.labels, v, ok, want.value)
		}
	}
	// The consumer counts a stored message a moment after the publish.
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, _ := scrape().Value("gdr_consumer_pending_messages", "stream", env.Queue.Stream(), "consumer", "pod")
		if v == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod consumer pending = %v 5s after the publish, want 1", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err = srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body strings.Builder
	_, _ = io.Copy(&body, resp.Body)
	for _, secret := range []string{"alice", "secret-project", "task-token-s3cret", "linux-7"} {
		if strings.Contains(body.String(), secret) {
			t.Errorf("/metrics shows %q", secret)
		}
	}
}
