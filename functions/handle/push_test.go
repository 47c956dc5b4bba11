package main

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/metricsenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// A job-mode run with GDR_METRICS_PUSH_URL pushes, as it ends, the outcomes of the messages it
// settled to the Pushgateway, in the group of job gdr-handle and its Pod (its host name): one
// assignment accepted, one that does not open (poison).
func TestJobModePushesItsOutcomesAtExit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := jetstreamenv.NewQueue(t)
	consumer := q.OpenConsumer(t, taskassignment.BackendPod, 4)
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	id, err := taskidentity.New(td, "alice/repo", "build", 11)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: 11, Pool: "linux"}, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Queue.Publish(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := q.JetStream.Publish(ctx, assignmentqueue.Subject(taskassignment.BackendPod), []byte("not an assignment")); err != nil {
		t.Fatal(err)
	}
	pg := metricsenv.StartPushgateway(t)
	cfg := Config{Batch: 2, FetchWait: time.Second, HoldFor: time.Second, LingerMax: time.Minute, PushSettings: metrics.PushSettings{PushURL: pg.URL}}
	h := handler.Handler{Worker: acceptAll{}, TrustDomain: td, Keys: jetstreamenv.Signer()}
	if err := runJob(ctx, cfg, h, consumer, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	pushes := pg.Pushes()
	if len(pushes) != 1 || pushes[0].Path != "/metrics/job/gdr-handle/instance/"+host {
		t.Fatalf("pushes %+v, want one to the group of job gdr-handle and instance %s", pushes, host)
	}
	for _, want := range []struct{ backend, outcome string }{{"pod", "accepted"}, {"unknown", "poison"}} {
		if v, ok := pushes[0].Families.Value("gdr_assignments_total", "backend", want.backend, "outcome", want.outcome); !ok || v != 1 {
			t.Errorf("pushed gdr_assignments_total{backend=%q,outcome=%q} = %v (present %v), want 1", want.backend, want.outcome, v, ok)
		}
	}
}
