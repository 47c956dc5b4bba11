package pull

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor/executortest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
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
		raw[i] = handlertest.Assignment(b, int64(i+1))
		handled[i] = handlertest.Assignment(b, int64(b.N+i+1))
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

	backend := executortest.NewMemory("node-1")
	j := job(c, handlertest.Worker(b, backend), nil)
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

// BenchmarkConsumeVsHandle compares the consume side alone, in one run:
// 3*b.N assignments are published beforehand (not timed: publishing, which
// waits for the store's acknowledgement of each, dominates both sides
// otherwise), then b.N are taken by raw fetch+ack (Fetch in batches of
// benchBatch, Ack each, timed until the server has applied every ack), b.N
// by the same loop that also opens each signed envelope (the least any
// consumer that authenticates its messages does), and the last b.N by
// handle's settle loop (Job.Run with Batch benchBatch: authenticate, decode,
// a trivial acceptor, confirmed ack). It reports the three rates and the
// ratios of handle's throughput to raw's (= raw time / handle time; the
// goal was at least 0.5) and to the authenticating loop's.
//
//	go test -run '^$' -bench ConsumeVsHandle -benchtime 2000x ./shared/handler/
func BenchmarkConsumeVsHandle(b *testing.B) {
	ctx := context.Background()
	env := jetstreamenv.NewQueue(b)
	q, c := env.Queue, env.OpenConsumer(b, taskassignment.BackendProcess, 1000)
	for i := range 3 * b.N {
		if _, err := q.Publish(ctx, handlertest.Assignment(b, int64(i+1))); err != nil {
			b.Fatal(err)
		}
	}
	outstanding := func() int {
		n, err := q.Outstanding(ctx, taskassignment.BackendProcess)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	if n := outstanding(); n != 3*b.N {
		b.Fatalf("%d messages queued, want %d", n, 3*b.N)
	}
	// fetchAck takes b.N messages by fetch + ack, each first passed to
	// look, and returns the time until the server has applied every ack.
	fetchAck := func(look func([]byte) error) time.Duration {
		left := outstanding() - b.N
		start := time.Now()
		for got := 0; got < b.N; {
			batch, err := c.Fetch(min(benchBatch, b.N-got), jetstream.FetchMaxWait(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			for m := range batch.Messages() {
				if err := look(m.Data()); err != nil {
					b.Fatal(err)
				}
				if err := m.Ack(); err != nil {
					b.Fatal(err)
				}
				got++
			}
			if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
				b.Fatal(err)
			}
		}
		for outstanding() != left { // every ack applied
			time.Sleep(100 * time.Microsecond)
		}
		return time.Since(start)
	}

	b.ResetTimer()
	rawTime := fetchAck(func([]byte) error { return nil })
	openTime := fetchAck(func(data []byte) error {
		_, err := env.Signer.Open(data)
		return err
	})

	accepted := 0
	j := job(c, handlertest.AcceptFunc(func(context.Context, taskassignment.Assignment) (bool, error) {
		accepted++
		return true, nil
	}), nil)
	j.Wait = time.Second
	start := time.Now()
	for got := 0; got < b.N; {
		j.Batch = min(benchBatch, b.N-got)
		sum, err := j.Run(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if sum.Accepted != sum.Fetched || sum.Fetched == 0 {
			b.Fatalf("run %+v did not accept everything", sum)
		}
		got += sum.Accepted
	}
	handleTime := time.Since(start) // every ack was confirmed
	b.StopTimer()
	if n := outstanding(); n != 0 || accepted != b.N {
		b.Fatalf("%d messages left, %d accepted of %d", n, accepted, b.N)
	}
	rawRate := float64(b.N) / rawTime.Seconds()
	openRate := float64(b.N) / openTime.Seconds()
	handleRate := float64(b.N) / handleTime.Seconds()
	b.ReportMetric(rawRate, "raw-msgs/s")
	b.ReportMetric(openRate, "raw+open-msgs/s")
	b.ReportMetric(handleRate, "handle-msgs/s")
	b.ReportMetric(handleRate/rawRate, "ratio")
	b.ReportMetric(handleRate/openRate, "ratio-vs-open")
	b.Logf("%d messages each: raw fetch+ack %.0f msgs/s, fetch+open+ack %.0f msgs/s, handle's settle loop %.0f msgs/s; ratio handle/raw %.2f, handle/(fetch+open+ack) %.2f",
		b.N, rawRate, openRate, handleRate, handleRate/rawRate, handleRate/openRate)
}
