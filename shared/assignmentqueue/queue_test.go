package assignmentqueue_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

func TestSubject(t *testing.T) {
	for _, tc := range []struct {
		b    taskassignment.BackendKind
		want string
	}{
		{taskassignment.BackendPod, "ci.assignment.pod"},
		{taskassignment.BackendOpenSandbox, "ci.assignment.opensandbox"},
		{taskassignment.BackendProcess, "ci.assignment.process"},
	} {
		if got := assignmentqueue.Subject(tc.b); got != tc.want {
			t.Errorf("Subject(%q) = %q, want %q", tc.b, got, tc.want)
		}
	}
}

func TestNewDefaultsStream(t *testing.T) {
	if got := assignmentqueue.New(nil, "").Stream(); got != assignmentqueue.DefaultStream {
		t.Errorf("New(js, \"\").Stream() = %q, want %q", got, assignmentqueue.DefaultStream)
	}
	if got := assignmentqueue.New(nil, "OTHER").Stream(); got != "OTHER" {
		t.Errorf("New(js, \"OTHER\").Stream() = %q, want OTHER", got)
	}
}

// checkStreamConfig fails the test unless the stream has the queue's
// configuration.
func checkStreamConfig(t *testing.T, cfg jetstream.StreamConfig) {
	t.Helper()
	if want := []string{"ci.assignment.>"}; !slices.Equal(cfg.Subjects, want) {
		t.Errorf("Subjects = %v, want %v", cfg.Subjects, want)
	}
	if cfg.Storage != jetstream.FileStorage {
		t.Errorf("Storage = %v, want file", cfg.Storage)
	}
	if cfg.Retention != jetstream.WorkQueuePolicy {
		t.Errorf("Retention = %v, want workqueue", cfg.Retention)
	}
	if cfg.Duplicates != assignmentqueue.DuplicateWindow {
		t.Errorf("Duplicates = %v, want %v", cfg.Duplicates, assignmentqueue.DuplicateWindow)
	}
}

func TestEnsureStreamCreatesAndIsIdempotent(t *testing.T) {
	ctx, js, q := newQueue(t)
	publish(t, ctx, q, assignment(t, taskassignment.BackendPod, 1))
	if err := q.EnsureStream(ctx); err != nil {
		t.Fatalf("second EnsureStream: %v", err)
	}
	s, err := js.Stream(ctx, assignmentqueue.DefaultStream)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	checkStreamConfig(t, s.CachedInfo().Config)
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("messages after second EnsureStream = %d, want 1", n)
	}
}

func TestEnsureStreamCorrectsDrift(t *testing.T) {
	for _, tc := range []struct {
		name   string
		drifts jetstream.StreamConfig
	}{
		{"short duplicate window", jetstream.StreamConfig{Subjects: []string{"ci.assignment.>"}, Duplicates: 30 * time.Second}},
		{"missing subjects", jetstream.StreamConfig{Subjects: []string{"ci.assignment.pod"}}},
		{"message limit", jetstream.StreamConfig{Subjects: []string{"ci.assignment.>"}, MaxMsgs: 10, Duplicates: assignmentqueue.DuplicateWindow}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			js := newJetStream(t)
			pre := tc.drifts
			pre.Name = "DRIFT"
			pre.Storage = jetstream.FileStorage
			pre.Retention = jetstream.WorkQueuePolicy
			if _, err := js.CreateStream(ctx, pre); err != nil {
				t.Fatalf("pre-create: %v", err)
			}
			q := assignmentqueue.New(js, "DRIFT").SignedBy(jetstreamenv.Signer())
			// A message stored before the correction survives it.
			publish(t, ctx, q, assignment(t, taskassignment.BackendPod, 1))

			if err := q.EnsureStream(ctx); err != nil {
				t.Fatalf("EnsureStream: %v", err)
			}
			s, err := js.Stream(ctx, "DRIFT")
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			cfg := s.CachedInfo().Config
			checkStreamConfig(t, cfg)
			if cfg.MaxMsgs != -1 {
				t.Errorf("MaxMsgs = %d, want -1 (unlimited)", cfg.MaxMsgs)
			}
			if n := s.CachedInfo().State.Msgs; n != 1 {
				t.Errorf("messages after correction = %d, want 1", n)
			}
			// The corrected subjects take every backend.
			publish(t, ctx, q, assignment(t, taskassignment.BackendOpenSandbox, 2))
		})
	}
}

func TestEnsureStreamRefusesUncorrectableDrift(t *testing.T) {
	for _, tc := range []struct {
		name      string
		retention jetstream.RetentionPolicy
		storage   jetstream.StorageType
		wantInErr []string
	}{
		{"limits retention", jetstream.LimitsPolicy, jetstream.FileStorage, []string{`"DRIFT"`, "retention", "Limits", "WorkQueue"}},
		{"interest retention", jetstream.InterestPolicy, jetstream.FileStorage, []string{`"DRIFT"`, "retention", "Interest"}},
		{"memory storage", jetstream.WorkQueuePolicy, jetstream.MemoryStorage, []string{`"DRIFT"`, "storage", "Memory", "File"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			js := newJetStream(t)
			pre := jetstream.StreamConfig{
				Name:       "DRIFT",
				Subjects:   []string{"ci.assignment.>"},
				Retention:  tc.retention,
				Storage:    tc.storage,
				Duplicates: 30 * time.Second,
			}
			if _, err := js.CreateStream(ctx, pre); err != nil {
				t.Fatalf("pre-create: %v", err)
			}
			err := assignmentqueue.New(js, "DRIFT").EnsureStream(ctx)
			if err == nil {
				t.Fatal("EnsureStream succeeded on a stream it cannot correct")
			}
			for _, w := range tc.wantInErr {
				if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(w)) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			s, err := js.Stream(ctx, "DRIFT")
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			if d := s.CachedInfo().Config.Duplicates; d != 30*time.Second {
				t.Errorf("Duplicates = %v after a refused EnsureStream, want it untouched (30s)", d)
			}
		})
	}
}

func TestOpenConsumerConfig(t *testing.T) {
	ctx, js, q := newQueue(t)
	for i, b := range taskassignment.BackendKinds() {
		maxInFlight := 3 + i
		c, err := q.OpenConsumer(ctx, b, maxInFlight)
		if err != nil {
			t.Fatalf("OpenConsumer(%s): %v", b, err)
		}
		// Read back from the server, not from the returned handle.
		info, err := js.Consumer(ctx, q.Stream(), string(b))
		if err != nil {
			t.Fatalf("consumer %s: %v", b, err)
		}
		cfg := info.CachedInfo().Config
		if cfg.Durable != string(b) || c.CachedInfo().Name != string(b) {
			t.Errorf("%s: Durable = %q, name = %q, want %q", b, cfg.Durable, c.CachedInfo().Name, b)
		}
		if want := assignmentqueue.Subject(b); cfg.FilterSubject != want {
			t.Errorf("%s: FilterSubject = %q, want %q", b, cfg.FilterSubject, want)
		}
		if cfg.AckPolicy != jetstream.AckExplicitPolicy {
			t.Errorf("%s: AckPolicy = %v, want explicit", b, cfg.AckPolicy)
		}
		if cfg.AckWait != 5*time.Minute {
			t.Errorf("%s: AckWait = %v, want 5m", b, cfg.AckWait)
		}
		if cfg.MaxAckPending != maxInFlight {
			t.Errorf("%s: MaxAckPending = %d, want %d", b, cfg.MaxAckPending, maxInFlight)
		}
		if cfg.MaxDeliver != 1000 {
			t.Errorf("%s: MaxDeliver = %d, want 1000", b, cfg.MaxDeliver)
		}
		if cfg.DeliverPolicy != jetstream.DeliverAllPolicy {
			t.Errorf("%s: DeliverPolicy = %v, want all", b, cfg.DeliverPolicy)
		}
	}
	// The backends' consumers are independent durables.
	names := consumerNames(t, ctx, js, q)
	if want := map[string]bool{"pod": true, "opensandbox": true, "process": true}; !maps.Equal(names, want) {
		t.Errorf("consumers = %v, want %v", names, want)
	}
}

func TestOpenConsumerUpdatesInPlace(t *testing.T) {
	ctx, js, q := newQueue(t)
	if _, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 2); err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	for i := range 3 {
		publish(t, ctx, q, assignment(t, taskassignment.BackendPod, int64(i+1)))
	}
	c, err := q.Consumer(ctx, taskassignment.BackendPod)
	if err != nil {
		t.Fatalf("Consumer: %v", err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	if n := len(drain(batch)); n != 1 {
		t.Fatalf("fetched %d, want 1", n)
	}

	// Reopening with another max in flight changes only the limit: the delivery
	// in flight and the pending messages stay.
	if _, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 7); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	eventually(t, "consumer after reopen", func() (bool, string) {
		got, err := js.Consumer(ctx, q.Stream(), "pod")
		if err != nil {
			t.Fatalf("consumer: %v", err)
		}
		info := got.CachedInfo()
		return info.Config.MaxAckPending == 7 && info.NumAckPending == 1 && info.NumPending == 2,
			fmt.Sprintf("MaxAckPending %d, ack pending %d, pending %d; want 7, 1, 2",
				info.Config.MaxAckPending, info.NumAckPending, info.NumPending)
	})
}

func TestOpenConsumerCorrectsDrift(t *testing.T) {
	ctx, js, q := newQueue(t)
	_, err := js.CreateConsumer(ctx, q.Stream(), jetstream.ConsumerConfig{
		Durable:       "pod",
		FilterSubject: "ci.assignment.pod",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    3,
		MaxAckPending: 100,
	})
	if err != nil {
		t.Fatalf("pre-create: %v", err)
	}
	if _, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 4); err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	c, err := js.Consumer(ctx, q.Stream(), "pod")
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	cfg := c.CachedInfo().Config
	if cfg.AckWait != assignmentqueue.AckWait || cfg.MaxDeliver != taskassignment.MaxDeliver || cfg.MaxAckPending != 4 {
		t.Errorf("after OpenConsumer: AckWait %v, MaxDeliver %d, MaxAckPending %d; want %v, %d, 4",
			cfg.AckWait, cfg.MaxDeliver, cfg.MaxAckPending, assignmentqueue.AckWait, taskassignment.MaxDeliver)
	}
}

func TestOpenConsumerRefuses(t *testing.T) {
	ctx, js, q := newQueue(t)
	for _, tc := range []struct {
		name        string
		backend     taskassignment.BackendKind
		maxInFlight int
		want        string
	}{
		{"zero max in flight", taskassignment.BackendPod, 0, "max in flight 0"},
		{"negative max in flight", taskassignment.BackendPod, -1, "max in flight -1"},
		{"unknown backend", "gpu", 1, `"gpu"`},
		{"wildcard backend", ">", 1, `">"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := q.OpenConsumer(ctx, tc.backend, tc.maxInFlight)
			if err == nil {
				t.Fatal("OpenConsumer succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), q.Stream()) {
				t.Errorf("error %q does not name %s and the stream", err, tc.want)
			}
		})
	}
	if n := len(consumerNames(t, ctx, js, q)); n != 0 {
		t.Errorf("refused calls left %d consumers", n)
	}
}

func TestConsumerLeavesConfigAlone(t *testing.T) {
	ctx, _, q := newQueue(t)
	if _, err := q.Consumer(ctx, taskassignment.BackendPod); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("Consumer before OpenConsumer: err = %v, want ErrConsumerNotFound", err)
	} else if !strings.Contains(err.Error(), `"pod"`) {
		t.Errorf("error %q does not name the consumer", err)
	}
	if _, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 3); err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	c, err := q.Consumer(ctx, taskassignment.BackendPod)
	if err != nil {
		t.Fatalf("Consumer: %v", err)
	}
	if got := c.CachedInfo().Config.MaxAckPending; got != 3 {
		t.Errorf("MaxAckPending = %d, want 3", got)
	}
}

func TestPublishDeduplicates(t *testing.T) {
	ctx, js, q := newQueue(t)
	a := assignment(t, taskassignment.BackendPod, 42)
	first, err := q.Publish(ctx, a)
	if err != nil {
		t.Fatalf("first Publish: %v", err)
	}
	if first.Duplicate || first.Stream != q.Stream() {
		t.Errorf("first PubAck = %+v, want stored in %s", first, q.Stream())
	}
	second, err := q.Publish(ctx, a)
	if err != nil {
		t.Fatalf("second Publish: %v", err)
	}
	if !second.Duplicate {
		t.Errorf("second PubAck.Duplicate = false, want true")
	}
	if second.Sequence != first.Sequence {
		t.Errorf("second PubAck.Sequence = %d, want the first's %d", second.Sequence, first.Sequence)
	}
	if n := streamMsgs(t, ctx, js, q); n != 1 {
		t.Errorf("messages = %d, want 1", n)
	}
}

func TestPublishSubjectPerBackend(t *testing.T) {
	ctx, js, q := newQueue(t)
	s, err := js.Stream(ctx, q.Stream())
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	for i, b := range taskassignment.BackendKinds() {
		a := assignment(t, b, int64(100+i))
		ack, err := q.Publish(ctx, a)
		if err != nil {
			t.Fatalf("Publish %s: %v", b, err)
		}
		m, err := s.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatalf("get %d: %v", ack.Sequence, err)
		}
		if want := "ci.assignment." + string(b); m.Subject != want {
			t.Errorf("%s: subject = %q, want %q", b, m.Subject, want)
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != a.ID {
			t.Errorf("%s: Nats-Msg-Id = %q, want %q", b, got, a.ID)
		}
		got, err := decode(m.Data)
		if err != nil {
			t.Fatalf("%s: decode: %v", b, err)
		}
		if !reflect.DeepEqual(got, a) {
			t.Errorf("%s: message = %+v, want %+v", b, got, a)
		}
	}
}

func TestPublishRefuses(t *testing.T) {
	ctx, js, q := newQueue(t)
	noID := assignment(t, taskassignment.BackendPod, 1)
	noID.ID = ""
	badBackend := assignment(t, taskassignment.BackendPod, 2)
	badBackend.Backend = "gpu"
	for _, tc := range []struct {
		name string
		q    *assignmentqueue.Queue
		a    taskassignment.Assignment
		want string
	}{
		{"empty ID", q, noID, "no ID"},
		{"unknown backend", q, badBackend, "pool-a-2"},
		// The subject belongs to the queue stream; a queue naming another
		// stream must not write into it.
		{"other stream", assignmentqueue.New(js, "OTHER").SignedBy(jetstreamenv.Signer()), assignment(t, taskassignment.BackendPod, 3), `"OTHER"`},
		// Nothing is ever written unsigned.
		{"no signer", assignmentqueue.New(js, ""), assignment(t, taskassignment.BackendPod, 4), "no signing key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.q.Publish(ctx, tc.a)
			if err == nil {
				t.Fatal("Publish succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
	if n := streamMsgs(t, ctx, js, q); n != 0 {
		t.Errorf("refused publishes stored %d messages", n)
	}
}

// consumerNames returns the names of the consumers on the queue's stream.
func consumerNames(t *testing.T, ctx context.Context, js jetstream.JetStream, q *assignmentqueue.Queue) map[string]bool {
	t.Helper()
	s, err := js.Stream(ctx, q.Stream())
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	lister := s.ConsumerNames(ctx)
	names := map[string]bool{}
	for name := range lister.Name() {
		names[name] = true
	}
	if err := lister.Err(); err != nil {
		t.Fatalf("consumer names: %v", err)
	}
	return names
}

// drain returns the messages of a fetched batch.
func drain(b jetstream.MessageBatch) []jetstream.Msg {
	var msgs []jetstream.Msg
	for m := range b.Messages() {
		msgs = append(msgs, m)
	}
	return msgs
}

// fetch pulls up to n messages, waiting at most wait.
func fetch(t *testing.T, c jetstream.Consumer, n int, wait time.Duration) []jetstream.Msg {
	t.Helper()
	b, err := c.Fetch(n, jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	msgs := drain(b)
	if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		t.Fatalf("Fetch: %v", err)
	}
	return msgs
}

func metadata(t *testing.T, m jetstream.Msg) *jetstream.MsgMetadata {
	t.Helper()
	md, err := m.Metadata()
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	return md
}

func TestNakRedelivers(t *testing.T) {
	ctx, js, q := newQueue(t)
	c, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 1)
	if err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	publish(t, ctx, q, assignment(t, taskassignment.BackendPod, 1))

	msgs := fetch(t, c, 1, 2*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("first fetch: %d messages, want 1", len(msgs))
	}
	if n := metadata(t, msgs[0]).NumDelivered; n != 1 {
		t.Fatalf("first delivery NumDelivered = %d, want 1", n)
	}
	if err := msgs[0].NakWithDelay(50 * time.Millisecond); err != nil {
		t.Fatalf("Nak: %v", err)
	}
	msgs = fetch(t, c, 1, 3*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("after Nak: %d messages, want the message again", len(msgs))
	}
	if n := metadata(t, msgs[0]).NumDelivered; n != 2 {
		t.Errorf("redelivery NumDelivered = %d, want 2", n)
	}
	if err := msgs[0].DoubleAck(ctx); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if n := streamMsgs(t, ctx, js, q); n != 0 {
		t.Errorf("messages after ack = %d, want 0 (work queue)", n)
	}
}

func TestTermRemoves(t *testing.T) {
	ctx, js, q := newQueue(t)
	c, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 1)
	if err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	publish(t, ctx, q, assignment(t, taskassignment.BackendPod, 1))
	msgs := fetch(t, c, 1, 2*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("fetch: %d messages, want 1", len(msgs))
	}
	if err := msgs[0].Term(); err != nil {
		t.Fatalf("Term: %v", err)
	}
	eventually(t, "terminated message leaves the stream", func() (bool, string) {
		n := streamMsgs(t, ctx, js, q)
		return n == 0, fmt.Sprintf("%d messages", n)
	})
	if msgs := fetch(t, c, 1, 200*time.Millisecond); len(msgs) != 0 {
		t.Errorf("terminated message delivered again (%d messages)", len(msgs))
	}
}

func TestMaxAckPendingCapsInFlight(t *testing.T) {
	ctx, _, q := newQueue(t)
	c, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 2)
	if err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	for i := range 5 {
		publish(t, ctx, q, assignment(t, taskassignment.BackendPod, int64(i+1)))
	}
	held := fetch(t, c, 5, 500*time.Millisecond)
	if len(held) != 2 {
		t.Fatalf("first fetch: %d messages, want 2 (capacity)", len(held))
	}
	if more := fetch(t, c, 5, 200*time.Millisecond); len(more) != 0 {
		t.Fatalf("fetch at capacity: %d messages, want 0", len(more))
	}
	if err := held[0].DoubleAck(ctx); err != nil {
		t.Fatalf("ack: %v", err)
	}
	more := fetch(t, c, 5, 500*time.Millisecond)
	if len(more) != 1 {
		t.Fatalf("fetch after one ack: %d messages, want 1", len(more))
	}
	if seen := metadata(t, more[0]).Sequence.Stream; seen <= metadata(t, held[1]).Sequence.Stream {
		t.Errorf("fetched stream sequence %d again", seen)
	}
}

func TestOutstandingAndQueued(t *testing.T) {
	ctx, js, q := newQueue(t)
	pod := taskassignment.BackendPod
	c, err := q.OpenConsumer(ctx, pod, 5)
	if err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	if _, err := q.OpenConsumer(ctx, taskassignment.BackendOpenSandbox, 5); err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	want := map[string]bool{}
	for i := range 3 {
		a := assignment(t, pod, int64(i+1))
		publish(t, ctx, q, a)
		want[a.ID] = true
	}
	other := assignment(t, taskassignment.BackendOpenSandbox, 9)
	publish(t, ctx, q, other)

	check := func(step string, wantOutstanding int, wantIDs map[string]bool, wantMalformed int) {
		t.Helper()
		// The consumer counts a newly stored message a moment after its
		// PubAck; Queued reads the stream itself and never lags.
		eventually(t, step+": Outstanding", func() (bool, string) {
			n, err := q.Outstanding(ctx, pod)
			if err != nil {
				t.Fatalf("%s: Outstanding: %v", step, err)
			}
			return n == wantOutstanding, fmt.Sprintf("Outstanding = %d, want %d", n, wantOutstanding)
		})
		ids, malformed, err := q.Queued(ctx, pod, testTD())
		if err != nil {
			t.Fatalf("%s: Queued: %v", step, err)
		}
		if !maps.Equal(ids, wantIDs) || malformed != wantMalformed {
			t.Errorf("%s: Queued = %v, %d malformed; want %v, %d", step, ids, malformed, wantIDs, wantMalformed)
		}
	}
	check("published", 3, want, 0)

	msgs := fetch(t, c, 2, 2*time.Second)
	if len(msgs) != 2 {
		t.Fatalf("fetch: %d messages, want 2", len(msgs))
	}
	check("delivered, not acked", 3, want, 0)

	acked, err := decode(msgs[0].Data())
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if err := msgs[0].DoubleAck(ctx); err != nil {
		t.Fatalf("ack: %v", err)
	}
	delete(want, acked.ID)
	check("one acked", 2, want, 0)

	// Raw garbage, a signed assignment of another backend, and a forged
	// (unsigned) pod assignment with the ID of a real task, on the pod
	// subject: all are malformed for pod, none is counted as queued (a
	// forgery must not make recover think a task is queued), and nothing
	// else changes.
	if _, err := js.Publish(ctx, "ci.assignment.pod", []byte("not an assignment")); err != nil {
		t.Fatalf("publish raw: %v", err)
	}
	misplaced := assignment(t, taskassignment.BackendOpenSandbox, 10)
	data, err := taskassignment.Encode(misplaced)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	if data, err = jetstreamenv.Signer().Seal(data); err != nil {
		t.Fatalf("seal: %v", err)
	}
	if _, err := js.Publish(ctx, "ci.assignment.pod", data); err != nil {
		t.Fatalf("publish misplaced: %v", err)
	}
	forged, err := taskassignment.Encode(assignment(t, pod, 11))
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	if _, err := js.Publish(ctx, "ci.assignment.pod", forged); err != nil {
		t.Fatalf("publish forged: %v", err)
	}
	check("malformed added", 5, want, 3)

	ids, malformed, err := q.Queued(ctx, taskassignment.BackendOpenSandbox, testTD())
	if err != nil {
		t.Fatalf("Queued(opensandbox): %v", err)
	}
	if wantOther := map[string]bool{other.ID: true}; !maps.Equal(ids, wantOther) || malformed != 0 {
		t.Errorf("Queued(opensandbox) = %v, %d malformed; want %v, 0", ids, malformed, wantOther)
	}
}

func TestQueuedEmptyAndWithoutConsumer(t *testing.T) {
	ctx, _, q := newQueue(t)
	ids, malformed, err := q.Queued(ctx, taskassignment.BackendProcess, testTD())
	if err != nil || len(ids) != 0 || ids == nil || malformed != 0 {
		t.Fatalf("Queued on an empty stream = %v, %d, %v; want an empty map", ids, malformed, err)
	}
	// Queued needs no consumer and creates none (a second consumer on a
	// work-queue subject would be refused anyway).
	a := assignment(t, taskassignment.BackendProcess, 5)
	publish(t, ctx, q, a)
	ids, _, err = q.Queued(ctx, taskassignment.BackendProcess, testTD())
	if err != nil {
		t.Fatalf("Queued: %v", err)
	}
	if !ids[a.ID] || len(ids) != 1 {
		t.Errorf("Queued = %v, want only %s", ids, a.ID)
	}
	if _, err := q.OpenConsumer(ctx, taskassignment.BackendProcess, 1); err != nil {
		t.Errorf("OpenConsumer after Queued: %v", err)
	}
	if _, err := q.Outstanding(ctx, taskassignment.BackendPod); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("Outstanding without consumer: err = %v, want ErrConsumerNotFound", err)
	}
}

// The caveat EnsureStream documents: an assignment acknowledged inside the
// duplicate window cannot be queued again until the window has passed.
func TestPublishAfterAckInsideWindowIsDropped(t *testing.T) {
	ctx, js, q := newQueue(t)
	c, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 1)
	if err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	a := assignment(t, taskassignment.BackendPod, 1)
	publish(t, ctx, q, a)
	msgs := fetch(t, c, 1, 2*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("fetch: %d messages, want 1", len(msgs))
	}
	if err := msgs[0].DoubleAck(ctx); err != nil {
		t.Fatalf("ack: %v", err)
	}
	ack, err := q.Publish(ctx, a)
	if err != nil {
		t.Fatalf("re-Publish: %v", err)
	}
	if !ack.Duplicate {
		t.Errorf("re-Publish inside the window stored the message again")
	}
	if n := streamMsgs(t, ctx, js, q); n != 0 {
		t.Errorf("messages = %d, want 0", n)
	}
}

// Why Queued reads messages directly: the work-queue stream refuses any other
// consumer on a backend's subject, ordered (no acks) or not.
func TestWorkQueueRefusesOtherConsumers(t *testing.T) {
	ctx, js, q := newQueue(t)
	if _, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 1); err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	for _, tc := range []struct {
		name string
		cfg  jetstream.ConsumerConfig
		code jetstream.ErrorCode
	}{
		{"ordered-like, no acks", jetstream.ConsumerConfig{FilterSubject: "ci.assignment.pod", AckPolicy: jetstream.AckNonePolicy}, 10084},
		{"same filter", jetstream.ConsumerConfig{FilterSubject: "ci.assignment.pod", AckPolicy: jetstream.AckExplicitPolicy}, 10100},
		{"wildcard filter", jetstream.ConsumerConfig{FilterSubject: "ci.assignment.>", AckPolicy: jetstream.AckExplicitPolicy}, 10100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := js.CreateConsumer(ctx, q.Stream(), tc.cfg)
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != tc.code {
				t.Fatalf("CreateConsumer: err = %v, want API error %d", err, tc.code)
			}
		})
	}
}
