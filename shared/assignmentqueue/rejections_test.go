package assignmentqueue_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestAdvisoryFields ties the advisory decoding to nats-server's own types:
// what the server marshals, Rejections reads.
func TestAdvisoryFields(t *testing.T) {
	ctx, js, q := newQueue(t)
	for _, tt := range []struct {
		subject string
		event   any
		want    taskassignment.Rejection
	}{
		{"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.CI_RUNNER.pod", server.JSConsumerDeliveryTerminatedAdvisory{
			TypedEvent: server.TypedEvent{Type: server.JSConsumerDeliveryTerminatedAdvisoryType, ID: "x", Time: time.Now()},
			Stream:     "CI_RUNNER", Consumer: "pod", StreamSeq: 12, Deliveries: 3, Reason: "permanent linux-7: no"},
			taskassignment.Rejection{Kind: taskassignment.Terminated, Consumer: "pod", QueueSeq: 12, Deliveries: 3, Reason: "permanent linux-7: no"}},
		{"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.CI_RUNNER.pod", server.JSConsumerDeliveryExceededAdvisory{
			TypedEvent: server.TypedEvent{Type: server.JSConsumerDeliveryExceededAdvisoryType, ID: "y", Time: time.Now()},
			Stream:     "CI_RUNNER", Consumer: "pod", StreamSeq: 13, Deliveries: 1000},
			taskassignment.Rejection{Kind: taskassignment.MaxDeliveries, Consumer: "pod", QueueSeq: 13, Deliveries: 1000}},
	} {
		data, err := json.Marshal(tt.event)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, tt.subject, data); err != nil {
			t.Fatal(err)
		}
		got, err := q.Rejections(ctx, 0)
		if err != nil || len(got) != 1 {
			t.Fatalf("Rejections = %+v, %v", got, err)
		}
		tt.want.Seq = got[0].Seq
		if got[0] != tt.want {
			t.Fatalf("Rejection = %+v, want %+v", got[0], tt.want)
		}
		if err := q.RemoveRejection(ctx, got[0].Seq); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRejectionsCaptureTheServersAdvisories: a termination and a message
// past MaxDeliver, as the server reports them, are stored in the capture
// stream until removed; advisories of another stream are not.
func TestRejectionsCaptureTheServersAdvisories(t *testing.T) {
	ctx, js, q := newQueue(t)
	// A second EnsureRejections is a no-op.
	if err := q.EnsureRejections(ctx); err != nil {
		t.Fatal(err)
	}
	a1, a2 := assignment(t, taskassignment.BackendPod, 1), assignment(t, taskassignment.BackendPod, 2)
	publish(t, ctx, q, a1)
	publish(t, ctx, q, a2)
	cfg := jetstream.ConsumerConfig{Durable: "pod", FilterSubject: assignmentqueue.Subject(taskassignment.BackendPod),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 100 * time.Millisecond, MaxDeliver: 1}
	c, err := js.CreateOrUpdateConsumer(ctx, q.Stream(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Another stream with a consumer and a termination: not captured.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	oc, err := js.CreateOrUpdateConsumer(ctx, "OTHER", jetstream.ConsumerConfig{Durable: "o", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	om, err := oc.Next()
	if err != nil {
		t.Fatal(err)
	}
	if err := om.TermWithReason(taskassignment.RejectedReason("linux-9", "elsewhere")); err != nil {
		t.Fatal(err)
	}

	msgs, err := c.Fetch(2)
	if err != nil {
		t.Fatal(err)
	}
	var seq1, seq2 uint64
	for m := range msgs.Messages() {
		a, err := decode(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		md, _ := m.Metadata()
		switch a.ID {
		case a1.ID:
			seq1 = md.Sequence.Stream
			if err := m.TermWithReason(taskassignment.RejectedReason(a1.ID, "pool \"gpu\" is not a pod pool")); err != nil {
				t.Fatal(err)
			}
		case a2.ID:
			seq2 = md.Sequence.Stream // left unacknowledged on its only delivery
		}
	}
	var got []taskassignment.Rejection
	eventually(t, "two advisories captured", func() (bool, string) {
		got, err = q.Rejections(ctx, 0)
		return err == nil && len(got) == 2, fmt.Sprintf("%d entries, %v", len(got), err)
	})
	term, maxd := got[0], got[1]
	if term.Kind == taskassignment.MaxDeliveries {
		term, maxd = maxd, term
	}
	if term.Kind != taskassignment.Terminated || term.Consumer != "pod" || term.QueueSeq != seq1 || term.Err != nil {
		t.Fatalf("termination = %+v", term)
	}
	if id, why, exhausted, ok := term.Cause(); !ok || id != a1.ID || exhausted || why != `pool "gpu" is not a pod pool` {
		t.Fatalf("Cause = %q, %q, %v, %v", id, why, exhausted, ok)
	}
	if maxd.Kind != taskassignment.MaxDeliveries || maxd.QueueSeq != seq2 || maxd.Err != nil {
		t.Fatalf("max deliveries = %+v", maxd)
	}
	// The message past MaxDeliver is still in the queue: read it, delete it.
	a, found, err := q.ExhaustedAssignment(ctx, maxd.QueueSeq, testTD())
	if err != nil || !found || a.ID != a2.ID {
		t.Fatalf("ExhaustedAssignment = %s, %v, %v", a.ID, found, err)
	}
	for range 2 { // idempotent
		if err := q.DeleteMessage(ctx, maxd.QueueSeq); err != nil {
			t.Fatal(err)
		}
	}
	if _, found, err := q.ExhaustedAssignment(ctx, maxd.QueueSeq, testTD()); err != nil || found {
		t.Fatalf("after DeleteMessage: found %v, %v", found, err)
	}
	if n := streamMsgs(t, ctx, js, q); n != 0 {
		t.Fatalf("queue holds %d messages", n)
	}
	// Entries stay until removed, removing twice is fine, a limit applies.
	if again, err := q.Rejections(ctx, 1); err != nil || len(again) != 1 || again[0].Seq != got[0].Seq {
		t.Fatalf("Rejections(1) = %+v, %v", again, err)
	}
	for _, r := range got {
		for range 2 {
			if err := q.RemoveRejection(ctx, r.Seq); err != nil {
				t.Fatal(err)
			}
		}
	}
	if left, err := q.Rejections(ctx, 0); err != nil || len(left) != 0 {
		t.Fatalf("after removal: %+v, %v", left, err)
	}
}

// TestRejectionStreamConfig: the capture stream is on disk, without limits
// that could drop an entry recover has not acted on.
func TestRejectionStreamConfig(t *testing.T) {
	ctx, js, q := newQueue(t)
	s, err := js.Stream(ctx, q.RejectionStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if q.RejectionStream() != "CI_RUNNER_REJECTED" || cfg.Storage != jetstream.FileStorage || cfg.Retention != jetstream.LimitsPolicy ||
		cfg.MaxAge != assignmentqueue.RejectionMaxAge || cfg.MaxMsgs != -1 || cfg.MaxBytes != -1 || len(cfg.Subjects) != 2 ||
		cfg.Subjects[0] != "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.CI_RUNNER.*" ||
		cfg.Subjects[1] != "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.CI_RUNNER.*" {
		t.Fatalf("config %+v", cfg)
	}
	// A wrong storage type is refused, not silently kept.
	if err := js.DeleteStream(ctx, q.RejectionStream()); err != nil {
		t.Fatal(err)
	}
	mem := cfg
	mem.Storage = jetstream.MemoryStorage
	if _, err := js.CreateStream(ctx, mem); err != nil {
		t.Fatal(err)
	}
	if err := q.EnsureRejections(ctx); err == nil || !strings.Contains(err.Error(), "storage") {
		t.Fatalf("EnsureRejections on a memory stream: %v", err)
	}
}
