package assignmentqueue_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

func TestFinishedNotices(t *testing.T) {
	ctx := testContext(t)
	js := newJetStream(t)
	f := assignmentqueue.NewFinished(js, "")
	if f.Stream() != "CI_RUNNER_FINISHED" {
		t.Fatalf("stream %q", f.Stream())
	}
	if _, err := f.Consumer(ctx, taskassignment.BackendPod); err == nil {
		t.Fatal("a consumer before Ensure")
	}
	// Nothing captures a notice before Ensure: the publish fails.
	if err := f.Publish(ctx, taskassignment.BackendPod, "linux-1"); err == nil {
		t.Fatal("a notice was accepted with no stream")
	}
	for range 2 { // idempotent
		if err := f.Ensure(ctx, taskassignment.BackendPod); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, f.Stream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if cfg.Retention != jetstream.WorkQueuePolicy || cfg.MaxAge != assignmentqueue.FinishedMaxAge || cfg.Subjects[0] != "ci.finished.>" {
		t.Fatalf("stream config %+v", cfg)
	}
	// The runner's retried final report stores one notice.
	for range 3 {
		if err := f.Publish(ctx, taskassignment.BackendPod, "linux-1"); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Publish(ctx, taskassignment.BackendPod, "linux-2"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		b  taskassignment.BackendKind
		id string
	}{{"docker", "linux-3"}, {taskassignment.BackendPod, "not an ID"}, {taskassignment.BackendPod, ""}} {
		if err := f.Publish(ctx, bad.b, bad.id); err == nil {
			t.Errorf("Publish(%q, %q) succeeded", bad.b, bad.id)
		}
	}
	c, err := f.Consumer(ctx, taskassignment.BackendPod)
	if err != nil {
		t.Fatal(err)
	}
	// The server counts a consumer's pending messages in the consumer's own goroutine, from the
	// stream's signals: right after the publishes it may not have counted the last one yet (seen
	// under CI's load), so the count is read again until it settles.
	info := c.CachedInfo()
	for deadline := time.Now().Add(5 * time.Second); info.NumPending != 2 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if info, err = c.Info(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if info.Config.MaxDeliver != taskassignment.FinishedMaxDeliver || info.NumPending != 2 {
		t.Fatalf("consumer %+v, %d pending", info.Config, info.NumPending)
	}
	batch, err := c.Fetch(5, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for m := range batch.Messages() {
		if m.Subject() != "ci.finished.pod" {
			t.Errorf("subject %q", m.Subject())
		}
		id, err := taskassignment.FinishedNotice(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
		_ = m.Ack()
	}
	if strings.Join(got, ",") != "linux-1,linux-2" {
		t.Fatalf("notices %v", got)
	}
}

func TestFinishedEnsureRefusesAnotherRetention(t *testing.T) {
	ctx := testContext(t)
	js := newJetStream(t)
	f := assignmentqueue.NewFinished(js, "Q")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q_FINISHED", Subjects: []string{"ci.finished.>"}}); err != nil {
		t.Fatal(err)
	}
	err := f.Ensure(ctx)
	if err == nil || !strings.Contains(err.Error(), "Q_FINISHED") {
		t.Fatalf("Ensure over a limits stream = %v", err)
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatal(err)
	}
}
