package intake

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskworker/taskworkertest"
)

const benchBatch = 100

// BenchmarkQueueVsHandle moves b.N assignments through the queue twice in
// one run: raw (publish, fetch in batches, ack) and through handle's core
// (publish, Job.Run with Batch benchBatch: decode, Worker.Accept on an
// in-memory backend, confirmed ack). It reports both rates and their ratio
// handle/raw; the goal is a ratio of at least 0.5.
func BenchmarkQueueVsHandle(b *testing.B) {
	ctx := context.Background()
	env := jetstreamenv.NewQueue(b)
	q, c := env.Queue, env.OpenConsumer(b, taskassignment.BackendProcess, 1000)
	raw := make([]taskassignment.Assignment, b.N)
	handled := make([]taskassignment.Assignment, b.N)
	for i := range b.N {
		raw[i] = assignment(b, int64(i+1))
		handled[i] = assignment(b, int64(b.N+i+1))
	}
	publishAll := func(as []taskassignment.Assignment) {
		for _, a := range as {
			if _, err := q.Publish(ctx, a); err != nil {
				b.Fatal(err)
			}
		}
	}

	b.ResetTimer()
	start := time.Now()
	publishAll(raw)
	for got := 0; got < b.N; {
		batch, err := c.Fetch(min(benchBatch, b.N-got), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			b.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.Ack(); err != nil {
				b.Fatal(err)
			}
			got++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			b.Fatal(err)
		}
	}
	rawTime := time.Since(start)

	backend := taskworkertest.NewMemory("node-1")
	j := job(c, worker(b, backend), nil)
	j.Batch, j.Wait = benchBatch, time.Second
	start = time.Now()
	publishAll(handled)
	for got := 0; got < b.N; {
		sum, err := j.Run(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if sum.Accepted != sum.Fetched {
			b.Fatalf("run %+v did not accept everything", sum)
		}
		got += sum.Accepted
	}
	handleTime := time.Since(start)
	b.StopTimer()
	if backend.Creates() != b.N {
		b.Fatalf("%d executors for %d assignments", backend.Creates(), b.N)
	}
	rawRate := float64(b.N) / rawTime.Seconds()
	handleRate := float64(b.N) / handleTime.Seconds()
	b.ReportMetric(rawRate, "raw-msgs/s")
	b.ReportMetric(handleRate, "handle-msgs/s")
	b.ReportMetric(handleRate/rawRate, "ratio")
}
