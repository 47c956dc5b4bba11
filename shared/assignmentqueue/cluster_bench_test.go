package assignmentqueue_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// clusterReadKeys is how many payloads and end marks the read benchmarks
// read among (each read picks the next, round robin).
const clusterReadKeys = 1000

// BenchmarkClusterRates measures the queue's rates on a 3-node JetStream
// cluster of nats-server processes (internal/testenv/natscluster, on this
// machine's loopback), every stream and bucket with 3 replicas
// (GDR_NATS_REPLICAS=3), each of our calls beside its floor, the raw
// jetstream call on the same stream or bucket, in the same run:
//
//   - publish: Queue.Publish (encode, sign, publish with Nats-Msg-Id and the
//     expected stream, wait for the PubAck: stored by a majority) against
//     jetstream.Publish of the same signed bytes with the same options;
//     by 1 publisher (what one dispatch does, one assignment after another)
//     and by 8 side by side;
//   - payload: Payloads.Get (a leader read, then open and unmarshal the
//     sealed task: what the gateway does when a runner fetches its task,
//     and recover for an orphan) against KeyValue.Get on the same bucket;
//   - ended: Endings.Ended (a leader read: what handle does for every
//     assignment it finds no executor for) against KeyValue.Get on the same
//     bucket;
//   - direct: KeyValue.Get on a bucket with the library's default, direct
//     gets answered by any replica: what the leader reads cost against it.
//
// Each reports ops/s. The client connects to all three servers (one of them,
// at random, serves it); a stream's leader may be on another.
//
//	go test -run '^$' -bench ClusterRates -benchtime 2000x ./shared/assignmentqueue/
func BenchmarkClusterRates(b *testing.B) {
	_, js := startCluster(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	q := assignmentqueue.New(js, "").SignedBy(jetstreamenv.Signer()).Replicated(3)
	if err := q.EnsureStream(ctx); err != nil {
		b.Fatal(err)
	}
	bucket := assignmentqueue.Bucket{Name: assignmentqueue.DefaultPayloadBucket, TTL: time.Hour, Replicas: 3}
	payloads, err := assignmentqueue.EnsurePayloads(ctx, js, bucket, testKey(7))
	if err != nil {
		b.Fatal(err)
	}
	endings, err := assignmentqueue.EnsureEndings(ctx, js, assignmentqueue.Bucket{Name: assignmentqueue.EndingsBucket(bucket.Name), TTL: time.Hour, Replicas: 3})
	if err != nil {
		b.Fatal(err)
	}
	rawPayloads, err := js.KeyValue(ctx, bucket.Name)
	if err != nil {
		b.Fatal(err)
	}
	rawEndings, err := js.KeyValue(ctx, assignmentqueue.EndingsBucket(bucket.Name))
	if err != nil {
		b.Fatal(err)
	}
	direct, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "DIRECT", TTL: time.Hour, History: 1, Storage: jetstream.FileStorage, Replicas: 3})
	if err != nil {
		b.Fatal(err)
	}
	if info, err := js.Stream(ctx, "KV_DIRECT"); err != nil || !info.CachedInfo().Config.AllowDirect {
		b.Fatalf("bucket DIRECT: %v, %v; want direct gets", info, err)
	}
	ids := make([]string, clusterReadKeys)
	var sealed []byte
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", testPool, i+1)
		if err := payloads.Put(ctx, ids[i], testTask(b, int64(i+1))); err != nil {
			b.Fatal(err)
		}
		if err := endings.MarkEnded(ctx, ids[i]); err != nil {
			b.Fatal(err)
		}
		if i == 0 {
			e, err := rawPayloads.Get(ctx, ids[0])
			if err != nil {
				b.Fatal(err)
			}
			sealed = e.Value()
		}
		if _, err := direct.Put(ctx, ids[i], sealed); err != nil {
			b.Fatal(err)
		}
	}

	// Every published message is new: the task IDs go on across the
	// sub-benchmarks and their repeats.
	var task atomic.Int64
	next := func() taskassignment.Assignment { return assignment(b, benchBackend, task.Add(1)) }
	signed := func(a taskassignment.Assignment) []byte {
		msg, err := taskassignment.Encode(a)
		if err != nil {
			b.Fatal(err)
		}
		data, err := jetstreamenv.Signer().Seal(msg)
		if err != nil {
			b.Fatal(err)
		}
		return data
	}
	ours := func(ctx context.Context, a taskassignment.Assignment, _ []byte) error {
		ack, err := q.Publish(ctx, a)
		if err == nil && ack.Duplicate {
			err = fmt.Errorf("%s: duplicate", a.ID)
		}
		return err
	}
	raw := func(ctx context.Context, a taskassignment.Assignment, data []byte) error {
		ack, err := js.Publish(ctx, assignmentqueue.Subject(a.Backend), data, jetstream.WithMsgID(a.ID), jetstream.WithExpectStream(q.Stream()))
		if err == nil && ack.Duplicate {
			err = fmt.Errorf("%s: duplicate", a.ID)
		}
		return err
	}
	for _, workers := range []int{1, 8} {
		for _, side := range []struct {
			name    string
			publish func(context.Context, taskassignment.Assignment, []byte) error
			sign    bool // raw publishes bytes signed beforehand, not timed
		}{{"ours", ours, false}, {"raw", raw, true}} {
			b.Run(fmt.Sprintf("publish/%s/publishers=%d", side.name, workers), func(b *testing.B) {
				as := make([]taskassignment.Assignment, b.N)
				data := make([][]byte, b.N)
				for i := range as {
					as[i] = next()
					if side.sign {
						data[i] = signed(as[i])
					}
				}
				b.ResetTimer()
				parallel(b, workers, func(i int) error { return side.publish(ctx, as[i], data[i]) })
			})
		}
	}

	reads := []struct {
		name string
		read func(ctx context.Context, id string) error
	}{
		{"payload/ours", func(ctx context.Context, id string) error {
			task, err := payloads.Get(ctx, id)
			if err == nil && task.GetId() == 0 {
				err = fmt.Errorf("%s: empty task", id)
			}
			return err
		}},
		{"payload/raw", func(ctx context.Context, id string) error { _, err := rawPayloads.Get(ctx, id); return err }},
		{"ended/ours", func(ctx context.Context, id string) error {
			ended, err := endings.Ended(ctx, id)
			if err == nil && !ended {
				err = fmt.Errorf("%s: no end mark", id)
			}
			return err
		}},
		{"ended/raw", func(ctx context.Context, id string) error { _, err := rawEndings.Get(ctx, id); return err }},
		{"direct/raw", func(ctx context.Context, id string) error { _, err := direct.Get(ctx, id); return err }},
	}
	for _, workers := range []int{1, 8} {
		for _, r := range reads {
			b.Run(r.name+"/readers="+strconv.Itoa(workers), func(b *testing.B) {
				parallel(b, workers, func(i int) error { return r.read(ctx, ids[i%len(ids)]) })
			})
		}
	}
}

// parallel runs op(0) .. op(b.N-1) on workers goroutines, each taking the
// next index, fails b on the first error, and reports ops/s.
func parallel(b *testing.B, workers int, op func(i int) error) {
	b.Helper()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := op(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if first != nil {
		b.Fatal(first)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
}
