package assignmentqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// The publish/pull/ack benchmark shape, shared with its counterparts in other
// packages so their figures compare: one embedded server, the queue stream,
// one backend consumer of max in flight benchMaxInFlight; b.N distinct assignments
// published one by one (each waiting for its PubAck), then all pulled in
// Fetch batches of benchBatch and each acknowledged; the timer stops once the
// stream is empty, i.e. every ack has been applied. Building the assignments
// and starting the server are not timed.
const (
	benchBatch       = 100
	benchMaxInFlight = 1000
	benchBackend     = taskassignment.BackendPod
	// benchFetchWait bounds one Fetch; a full batch normally returns at once.
	benchFetchWait = 5 * time.Second
)

// BenchmarkPublishPullAck measures raw JetStream: Queue.Publish, then
// Consumer.Fetch and Msg.Ack, with no handling between pull and ack.
// Reported: ns/op per message end to end, and the publish and pull+ack
// phases per message.
func BenchmarkPublishPullAck(b *testing.B) {
	ctx := context.Background()
	js := newJetStream(b)
	q := assignmentqueue.New(js, "").SignedBy(jetstreamenv.Signer())
	if err := q.EnsureStream(ctx); err != nil {
		b.Fatalf("EnsureStream: %v", err)
	}
	c, err := q.OpenConsumer(ctx, benchBackend, benchMaxInFlight)
	if err != nil {
		b.Fatalf("OpenConsumer: %v", err)
	}
	as := make([]taskassignment.Assignment, b.N)
	for i := range as {
		as[i] = assignment(b, benchBackend, int64(i+1))
	}

	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for _, a := range as {
		if _, err := q.Publish(ctx, a); err != nil {
			b.Fatalf("Publish: %v", err)
		}
	}
	published := time.Now()
	for got := 0; got < b.N; {
		batch, err := c.Fetch(min(benchBatch, b.N-got), jetstream.FetchMaxWait(benchFetchWait))
		if err != nil {
			b.Fatalf("Fetch: %v", err)
		}
		n := 0
		for m := range batch.Messages() {
			if err := m.Ack(); err != nil {
				b.Fatalf("Ack: %v", err)
			}
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			b.Fatalf("Fetch: %v", err)
		}
		if n == 0 {
			b.Fatalf("Fetch returned nothing after %d of %d messages", got, b.N)
		}
		got += n
	}
	waitEmpty(b, ctx, js, q)
	done := time.Now()
	b.StopTimer()

	perMsg := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(perMsg(published.Sub(start)), "publish-ns/msg")
	b.ReportMetric(perMsg(done.Sub(published)), "pullack-ns/msg")
	b.ReportMetric(float64(b.N)/done.Sub(start).Seconds(), "msgs/s")
}

// waitEmpty waits until the queue's stream holds no message: with work-queue
// retention, until every ack has been applied.
func waitEmpty(b *testing.B, ctx context.Context, js jetstream.JetStream, q *assignmentqueue.Queue) {
	b.Helper()
	s, err := js.Stream(ctx, q.Stream())
	if err != nil {
		b.Fatalf("stream: %v", err)
	}
	deadline := time.Now().Add(benchFetchWait)
	for {
		info, err := s.Info(ctx)
		if err != nil {
			b.Fatalf("stream info: %v", err)
		}
		if info.State.Msgs == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d messages still in the stream %v after the last ack", info.State.Msgs, benchFetchWait)
		}
		time.Sleep(time.Millisecond)
	}
}
