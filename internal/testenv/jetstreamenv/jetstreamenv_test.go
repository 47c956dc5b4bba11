package jetstreamenv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

func TestStartServesJetStreamOnLoopback(t *testing.T) {
	s, url := jetstreamenv.Start(t)
	if !strings.HasPrefix(url, "nats://127.0.0.1:") {
		t.Fatalf("client URL = %q, want nats://127.0.0.1:<port>", url)
	}
	if url == "nats://127.0.0.1:4222" {
		t.Fatalf("client URL %q uses the default port, want a random one", url)
	}
	if !strings.HasPrefix(s.StoreDir(), os.TempDir()) {
		t.Fatalf("store dir %q is not under the temporary directory %q", s.StoreDir(), os.TempDir())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, js := jetstreamenv.Connect(t, url)
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("account info: %v", err)
	}
}

// TestMonitoringServesJszOnLoopback reads a consumer's counts from /jsz, as
// KEDA's nats-jetstream scaler does.
func TestMonitoringServesJszOnLoopback(t *testing.T) {
	s, url := jetstreamenv.Start(t)
	addr := s.MonitorAddr()
	if addr == nil || addr.IP.String() != "127.0.0.1" || addr.Port == 8222 {
		t.Fatalf("monitoring address = %v, want 127.0.0.1 on a random port", addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, js := jetstreamenv.Connect(t, url)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MON", Subjects: []string{"mon"}}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js.CreateConsumer(ctx, "MON", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	before := time.Now()
	for range 2 {
		if _, err := js.Publish(ctx, "mon", []byte("x")); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	after := time.Now()
	// The consumer's state reaches /jsz a moment after the publish acks
	// (seen: 1 of 2 right after them): poll, as KEDA does every interval.
	var last string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		c, found, err := jetstreamenv.MonitoredConsumer(ctx, addr.String(), "MON", "c")
		pending := c.Pending
		switch {
		case err != nil:
			t.Fatal(err)
		case found && pending == 2:
			if c.StreamLast.Before(before.Add(-time.Second)) || c.StreamLast.After(after.Add(time.Second)) {
				t.Fatalf("stream's last message stored at %v, want between the publishes (%v, %v)", c.StreamLast, before, after)
			}
			return
		}
		last = fmt.Sprintf("found=%v num_pending=%d", found, pending)
	}
	t.Fatalf("/jsz never showed MON/c with num_pending 2 (last: %s)", last)
}

func TestServersAreIndependent(t *testing.T) {
	_, url1 := jetstreamenv.Start(t)
	_, url2 := jetstreamenv.Start(t)
	if url1 == url2 {
		t.Fatalf("two servers share URL %q", url1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, js1 := jetstreamenv.Connect(t, url1)
	_, js2 := jetstreamenv.Connect(t, url2)
	if _, err := js1.CreateStream(ctx, jetstream.StreamConfig{Name: "ONLY1", Subjects: []string{"only1"}}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js2.Stream(ctx, "ONLY1"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("stream on the other server: err = %v, want ErrStreamNotFound", err)
	}
}

func TestCleanupShutsServerDown(t *testing.T) {
	var url string
	t.Run("inner", func(t *testing.T) {
		_, url = jetstreamenv.Start(t)
	})
	nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.MaxReconnects(0))
	if err == nil {
		nc.Close()
		t.Fatalf("connected to %s after the test that started it ended", url)
	}
}

func TestRestartKeepsStoreAndPort(t *testing.T) {
	s, url := jetstreamenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, js := jetstreamenv.Connect(t, url)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"keep"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js.Publish(ctx, "keep", []byte("x")); err != nil {
		t.Fatalf("publish: %v", err)
	}

	monitor := s.MonitorAddr().String()
	s2, url2 := jetstreamenv.Restart(t, s)
	if url2 != url {
		t.Fatalf("restarted URL = %q, want %q", url2, url)
	}
	if got := s2.MonitorAddr().String(); got != monitor {
		t.Fatalf("restarted monitoring address = %s, want %s", got, monitor)
	}
	// The old connection reconnects; poll until the stream answers. A request
	// sent while the new server is still starting JetStream gets no answer at
	// all, so each attempt has a deadline of its own.
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, time.Second)
		st, err := js.Stream(attempt, "KEEP")
		cancelAttempt()
		if err == nil {
			if n := st.CachedInfo().State.Msgs; n != 1 {
				t.Fatalf("messages after restart = %d, want 1", n)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("stream after restart: %v (connection %v)", err, nc.Status())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNewQueueHasStreamAndPayloadsAndNoConsumer(t *testing.T) {
	q := jetstreamenv.NewQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := q.JetStream.Stream(ctx, assignmentqueue.DefaultStream)
	if err != nil {
		t.Fatalf("stream %s: %v", assignmentqueue.DefaultStream, err)
	}
	if n := st.CachedInfo().State.Consumers; n != 0 {
		t.Fatalf("consumers = %d, want 0", n)
	}
	if q.Queue.Stream() != assignmentqueue.DefaultStream || q.Payloads.Bucket() != assignmentqueue.DefaultPayloadBucket {
		t.Fatalf("stream %q, bucket %q", q.Queue.Stream(), q.Payloads.Bucket())
	}
	task := &runnerv1.Task{Id: 7, WorkflowPayload: []byte("jobs: {}")}
	if err := q.Payloads.Put(ctx, "a-7", task); err != nil {
		t.Fatalf("put payload: %v", err)
	}
	if got, err := q.Payloads.Get(ctx, "a-7"); err != nil || got.GetId() != 7 {
		t.Fatalf("get payload = %v, %v", got, err)
	}
	q.OpenConsumer(t, taskassignment.BackendProcess, 3)
	if n, err := q.Queue.Outstanding(ctx, taskassignment.BackendProcess); err != nil || n != 0 {
		t.Fatalf("Outstanding after OpenConsumer = %d, %v", n, err)
	}
}
