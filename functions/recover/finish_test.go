package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor/executortest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// finish binds each backend's notices consumer, which handle-setup creates;
// without it the run fails and says what to run.
func TestFinishModeBindsHandleSetupsConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	env := jetstreamenv.NewQueue(t)
	r := &recoverer.Recoverer{
		Backends: map[taskassignment.BackendKind]executor.Backend{taskassignment.BackendProcess: executortest.NewMemory("")},
		Pools:    map[string]recoverer.Pool{"linux": {Pool: runnerpool.Pool{Name: "linux", Backend: taskassignment.BackendProcess, Capacity: 1}}},
		Payloads: env.Payloads, Queue: env.Queue, Sender: env.Queue,
	}
	cfg := Config{Stream: assignmentqueue.DefaultStream, Batch: 4, FetchWait: 300 * time.Millisecond, Retry: time.Second}
	log := slog.New(slog.DiscardHandler)

	err := finish(ctx, cfg, r, env.JetStream, log)
	if err == nil || !strings.Contains(err.Error(), "GDR_MODE=setup") {
		t.Fatalf("finish() without a consumer = %v, want an error naming handle-setup", err)
	}

	finished := assignmentqueue.NewFinished(env.JetStream, cfg.Stream)
	if err := finished.Ensure(ctx, taskassignment.BackendProcess); err != nil {
		t.Fatal(err)
	}
	if err := finished.Publish(ctx, taskassignment.BackendProcess, "linux-1"); err != nil {
		t.Fatal(err)
	}
	if err := finish(ctx, cfg, r, env.JetStream, log); err != nil {
		t.Fatal(err)
	}
	c, err := finished.Consumer(ctx, taskassignment.BackendProcess)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.NumPending != 0 || info.NumAckPending != 0 || info.Delivered.Consumer != 1 {
		t.Fatalf("consumer after a run: %+v, %v; want the one notice delivered and settled", info, err)
	}
}
