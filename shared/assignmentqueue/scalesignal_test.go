package assignmentqueue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
)

// settle bounds how long the scale signal may take to follow a change: the
// marker's PayloadMarkerTTL, then the server's expiry timer, which fires
// within about a second of the marker's due time.
const settle = assignmentqueue.PayloadMarkerTTL + 2*time.Second

// gatewayPending returns the num_pending and num_ack_pending of bucket's
// GatewayConsumer, as the consumer's info reports them.
func gatewayPending(t testing.TB, ctx context.Context, js jetstream.JetStream, bucket string) (uint64, int) {
	t.Helper()
	c, err := js.Consumer(ctx, "KV_"+bucket, assignmentqueue.GatewayConsumer)
	if err != nil {
		t.Fatalf("consumer %s on KV_%s: %v", assignmentqueue.GatewayConsumer, bucket, err)
	}
	info := c.CachedInfo()
	return info.NumPending, info.NumAckPending
}

// waitPending polls until bucket's GatewayConsumer counts want pending and
// nothing awaiting an ack, or fails the test after settle.
func waitPending(t testing.TB, ctx context.Context, js jetstream.JetStream, bucket string, want uint64, why string) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for {
		pending, ackPending := gatewayPending(t, ctx, js, bucket)
		if pending == want && ackPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: gateway consumer counts %d pending, %d ack pending after %v; want %d, 0", why, pending, ackPending, settle, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// putWithMarks stores a payload for each ID, with a started and a sent mark
// beside it: the marks must not count.
func putWithMarks(t testing.TB, ctx context.Context, p *assignmentqueue.Payloads, ids ...string) {
	t.Helper()
	for i, id := range ids {
		if err := p.Put(ctx, id, testTask(t, int64(i+1))); err != nil {
			t.Fatal(err)
		}
		if err := p.MarkStarted(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := p.MarkSent(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// The gateway consumer is created with the bucket, as a durable that only
// counts: no ack to wait for, every payload from the first, never removed
// for inactivity, filtered to one-token keys (payloads, not marks).
func TestEnsurePayloadsCreatesTheGatewayConsumer(t *testing.T) {
	ctx, js, _, _ := newPayloads(t, testKey(1))
	c, err := js.Consumer(ctx, "KV_"+testBucket, assignmentqueue.GatewayConsumer)
	if err != nil {
		t.Fatalf("gateway consumer: %v", err)
	}
	cfg := c.CachedInfo().Config
	if cfg.Durable != assignmentqueue.GatewayConsumer || cfg.FilterSubject != "$KV."+testBucket+".*" || len(cfg.FilterSubjects) != 0 ||
		cfg.AckPolicy != jetstream.AckNonePolicy || cfg.DeliverPolicy != jetstream.DeliverAllPolicy ||
		cfg.InactiveThreshold != 0 || cfg.DeliverSubject != "" {
		t.Errorf("gateway consumer config %+v; want durable %q, filter $KV.%s.*, ack none, deliver all, never inactive, pull",
			cfg, assignmentqueue.GatewayConsumer, testBucket)
	}
	if got := bucketConfig(t, ctx, js).LimitMarkerTTL; got != assignmentqueue.PayloadMarkerTTL {
		t.Errorf("bucket LimitMarkerTTL %v, want %v", got, assignmentqueue.PayloadMarkerTTL)
	}
}

// num_pending is the payloads in flight: the marks beside them do not count,
// and a deleted payload stops counting within PayloadMarkerTTL and the
// server's expiry.
func TestGatewayConsumerCountsPayloads(t *testing.T) {
	ctx, js, p, _ := newPayloads(t, testKey(1))
	waitPending(t, ctx, js, testBucket, 0, "empty bucket")
	putWithMarks(t, ctx, p, "pool-a-1", "pool-a-2", "pool-a-3")
	waitPending(t, ctx, js, testBucket, 3, "three payloads, each with a started and a sent mark")

	if err := p.Delete(ctx, "pool-a-2"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitPending(t, ctx, js, testBucket, 2, "one of three deleted")
	t.Logf("a deletion stopped counting after %v", time.Since(start).Round(10*time.Millisecond))
	for _, id := range []string{"pool-a-1", "pool-a-3"} {
		if err := p.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	waitPending(t, ctx, js, testBucket, 0, "all deleted")

	// Nothing an expired marker leaves behind reads as a payload or a mark.
	if ids, err := p.IDs(ctx); err != nil || len(ids) != 0 {
		t.Errorf("IDs after the markers expired = %v, %v; want none", ids, err)
	}
	if stored, err := p.Stored(ctx); err != nil || len(stored) != 0 {
		t.Errorf("Stored after the markers expired = %v, %v; want none", stored, err)
	}
	if started, err := p.Started(ctx, "pool-a-1"); err != nil || started {
		t.Errorf("Started after the markers expired = %v, %v", started, err)
	}
	if _, err := p.LastSent(ctx, "pool-a-1"); err == nil {
		t.Error("LastSent after the markers expired found a payload")
	}
	// A payload expiring at the bucket's TTL stops counting too.
	short, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: "SHORT", TTL: 500 * time.Millisecond}, testKey(1))
	if err != nil {
		t.Fatal(err)
	}
	putWithMarks(t, ctx, short, "pool-a-9")
	waitPending(t, ctx, js, "SHORT", 0, "a payload past the bucket's TTL")
}

// KEDA's nats-jetstream trigger reads the lag from nats-server's monitoring
// endpoint (/jsz?consumers=true): the stream KV_CI_TASKS and the consumer
// "gateway", which is what deploy/keda configures it with.
func TestGatewayConsumerOnTheMonitoringEndpoint(t *testing.T) {
	ctx := testContext(t)
	s, url := jetstreamenv.Start(t)
	_, js := jetstreamenv.Connect(t, url)
	p, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: assignmentqueue.DefaultPayloadBucket, TTL: time.Hour}, testKey(1))
	if err != nil {
		t.Fatal(err)
	}
	const stream, consumer = "KV_CI_TASKS", "gateway"
	if assignmentqueue.GatewayConsumer != consumer || "KV_"+assignmentqueue.DefaultPayloadBucket != stream {
		t.Fatalf("the scale signal is %s on KV_%s; deploy/keda reads %s on %s", assignmentqueue.GatewayConsumer, assignmentqueue.DefaultPayloadBucket, consumer, stream)
	}
	monitored := func(want uint64, why string) {
		t.Helper()
		deadline := time.Now().Add(settle)
		for {
			st, found, err := jetstreamenv.MonitoredConsumer(ctx, s.MonitorAddr().String(), stream, consumer)
			if err != nil {
				t.Fatal(err)
			}
			// KEDA's metric: num_pending + num_ack_pending.
			if found && st.Pending+st.AckPending == want && st.AckPending == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: /jsz lists %s on %s: %v, num_pending %d, num_ack_pending %d; want %d", why, consumer, stream, found, st.Pending, st.AckPending, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	monitored(0, "no payload")
	putWithMarks(t, ctx, p, "linux-1", "linux-2")
	monitored(2, "two payloads")
	if err := p.Delete(ctx, "linux-1"); err != nil {
		t.Fatal(err)
	}
	monitored(1, "one deleted")
	if err := p.Delete(ctx, "linux-2"); err != nil {
		t.Fatal(err)
	}
	monitored(0, "both deleted: the gateway may scale to zero")
}

// A bucket an earlier version made (no marker TTL, so deletions leave
// markers that count until the bucket's TTL) is converged in place: its
// values kept, its old markers replaced by expiring ones, later deletions
// expiring too. Ensuring again changes nothing, the consumer included.
func TestEnsurePayloadsUpgradesAnOldBucket(t *testing.T) {
	ctx := testContext(t)
	js := newJetStream(t)
	// As the previous EnsurePayloads made it, and used it: Delete purged
	// without a TTL.
	raw, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: testBucket, TTL: time.Hour, History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"linux-1", "linux-2", "linux-3", "started.linux-1"} {
		if _, err := raw.Put(ctx, k, []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"linux-2", "linux-3", "started.linux-1"} {
		if err := raw.Purge(ctx, k); err != nil {
			t.Fatal(err)
		}
	}

	p, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour}, testKey(1))
	if err != nil {
		t.Fatalf("EnsurePayloads on an old bucket: %v", err)
	}
	if cfg := bucketConfig(t, ctx, js); cfg.LimitMarkerTTL != assignmentqueue.PayloadMarkerTTL || cfg.TTL != time.Hour || cfg.History != 1 {
		t.Fatalf("converged bucket: marker TTL %v, TTL %v, history %d; want %v, 1h, 1", cfg.LimitMarkerTTL, cfg.TTL, cfg.History, assignmentqueue.PayloadMarkerTTL)
	}
	if ids, err := p.IDs(ctx); err != nil || !slices.Equal(ids, []string{"linux-1"}) {
		t.Fatalf("IDs after the upgrade = %v, %v; want the payload kept", ids, err)
	}
	// The old markers of linux-2 and linux-3 stop counting.
	waitPending(t, ctx, js, testBucket, 1, "old markers after the upgrade")
	if err := p.Delete(ctx, "linux-1"); err != nil {
		t.Fatal(err)
	}
	waitPending(t, ctx, js, testBucket, 0, "deleted after the upgrade")

	// Ensuring again leaves the consumer as it was (same creation, same
	// state) and the count right.
	putWithMarks(t, ctx, p, "linux-4")
	waitPending(t, ctx, js, testBucket, 1, "a payload before ensuring again")
	before, err := js.Consumer(ctx, "KV_"+testBucket, assignmentqueue.GatewayConsumer)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour}, testKey(1)); err != nil {
			t.Fatalf("EnsurePayloads again: %v", err)
		}
	}
	after, err := js.Consumer(ctx, "KV_"+testBucket, assignmentqueue.GatewayConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if b, a := before.CachedInfo(), after.CachedInfo(); !a.Created.Equal(b.Created) || a.Config.FilterSubject != b.Config.FilterSubject ||
		a.Delivered.Consumer != b.Delivered.Consumer || a.Delivered.Stream != b.Delivered.Stream || a.NumPending != 1 {
		t.Errorf("consumer after ensuring again: created %v (was %v), filter %q, delivered %+v (was %+v), pending %d; want it untouched, 1 pending",
			a.Created, b.Created, a.Config.FilterSubject, a.Delivered, b.Delivered, a.NumPending)
	}
}

// A payload store opened on a bucket that takes no message TTLs (one that
// dispatch has not converged yet during an upgrade) still deletes: its
// markers then count until the bucket's TTL, as before.
func TestDeleteOnABucketWithoutMarkerTTL(t *testing.T) {
	ctx := testContext(t)
	js := newJetStream(t)
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: testBucket, TTL: time.Hour, History: 1, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_"+testBucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowDirect = false // readers refuse direct gets; the rest as an old dispatch left it
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	p, err := assignmentqueue.OpenPayloads(ctx, js, testBucket, testKey(1))
	if err != nil {
		t.Fatal(err)
	}
	putWithMarks(t, ctx, p, "linux-1")
	if err := p.Delete(ctx, "linux-1"); err != nil {
		t.Fatalf("Delete on a bucket without message TTLs: %v", err)
	}
	if _, err := p.Get(ctx, "linux-1"); err == nil {
		t.Fatal("the payload survived Delete")
	}
	if started, err := p.Started(ctx, "linux-1"); err != nil || started {
		t.Fatalf("Started after Delete = %v, %v", started, err)
	}
}

// A consumer of that name made by hand with another configuration is
// converged where the server allows, and otherwise refused with an error
// naming the consumer, the bucket and the way out.
func TestEnsurePayloadsConvergesTheGatewayConsumer(t *testing.T) {
	ctx, js, p, _ := newPayloads(t, testKey(1))
	stream := "KV_" + testBucket
	if err := js.DeleteConsumer(ctx, stream, assignmentqueue.GatewayConsumer); err != nil {
		t.Fatal(err)
	}
	// Updatable: the filter (here every key, marks included).
	if _, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: assignmentqueue.GatewayConsumer,
		FilterSubject: "$KV." + testBucket + ".>", AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	putWithMarks(t, ctx, p, "linux-1")
	if _, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour}, testKey(1)); err != nil {
		t.Fatalf("EnsurePayloads over a consumer with another filter: %v", err)
	}
	waitPending(t, ctx, js, testBucket, 1, "after converging the filter")

	// Not updatable: the ack policy.
	if err := js.DeleteConsumer(ctx, stream, assignmentqueue.GatewayConsumer); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: assignmentqueue.GatewayConsumer,
		FilterSubject: "$KV." + testBucket + ".*", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	_, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour}, testKey(1))
	if err == nil {
		t.Fatal("EnsurePayloads over a consumer it cannot converge succeeded")
	}
	for _, want := range []string{testBucket, `"` + assignmentqueue.GatewayConsumer + `"`, "delete"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// Deletion markers now expire, and a listing must end even when the last
// keys it was told about expire before they reach it (the client's watcher
// then waits for them forever). Listings race many expiring markers here;
// each must end with the payloads, none may hang.
func TestListingEndsWhileMarkersExpire(t *testing.T) {
	ctx, _, p, raw := newPayloads(t, testKey(1))
	const live, deleted = 200, 400
	var want []string
	for i := range live {
		id := fmt.Sprintf("live-%d", i)
		if _, err := raw.Put(ctx, id, []byte{1}); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	slices.Sort(want)
	var hung, wrong int
	for round := range 3 {
		for i := range deleted {
			id := fmt.Sprintf("gone-%d-%d", round, i)
			if _, err := raw.Put(ctx, id, []byte{1}); err != nil {
				t.Fatal(err)
			}
			if err := p.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		// List, two at a time, across the moment the markers expire.
		end := time.Now().Add(assignmentqueue.PayloadMarkerTTL + 1500*time.Millisecond)
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range 2 {
			wg.Go(func() {
				for time.Now().Before(end) {
					lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					ids, err := p.IDs(lctx)
					cancel()
					mu.Lock()
					switch {
					case errors.Is(err, context.DeadlineExceeded):
						hung++
					case err != nil:
						t.Errorf("IDs: %v", err)
					case !slices.Equal(ids, want):
						wrong++
					}
					stop := hung > 0
					mu.Unlock()
					if stop {
						return
					}
				}
			})
		}
		wg.Wait()
		if hung > 0 || wrong > 0 {
			t.Fatalf("round %d: %d listings hung, %d listed other keys than the %d payloads", round, hung, wrong, live)
		}
	}
}

// On a 3-node cluster the gateway consumer follows the bucket's replica
// count (1, then 3 when the bucket is scaled up), and its leader, which
// KEDA's trigger asks, counts the payloads as on one server.
func TestGatewayConsumerOnACluster(t *testing.T) {
	c, js := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	peers := func() int {
		t.Helper()
		cons, err := js.Consumer(ctx, "KV_"+testBucket, assignmentqueue.GatewayConsumer)
		if err != nil {
			t.Fatal(err)
		}
		if cl := cons.CachedInfo().Cluster; cl != nil {
			return 1 + len(cl.Replicas)
		}
		return 1
	}
	if _, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour, Replicas: 1}, testKey(1)); err != nil {
		t.Fatal(err)
	}
	if n := peers(); n != 1 {
		t.Fatalf("gateway consumer of a bucket of 1 replica: %d replicas", n)
	}
	p, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour, Replicas: 3}, testKey(1))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the gateway consumer scaled with its bucket", func() (bool, string) {
		n := peers()
		return n == 3, fmt.Sprintf("%d replicas", n)
	})
	putWithMarks(t, ctx, p, "linux-1", "linux-2", "linux-3")
	if err := p.Delete(ctx, "linux-2"); err != nil {
		t.Fatal(err)
	}
	waitPending(t, ctx, js, testBucket, 2, "three payloads on a cluster, one deleted")

	cons, err := js.Consumer(ctx, "KV_"+testBucket, assignmentqueue.GatewayConsumer)
	if err != nil {
		t.Fatal(err)
	}
	leader := c.Index(cons.CachedInfo().Cluster.Leader)
	if leader < 0 {
		t.Fatalf("consumer leader %q is none of the servers", cons.CachedInfo().Cluster.Leader)
	}
	st, found, err := jetstreamenv.MonitoredConsumer(ctx, c.MonitorAddr(leader), "KV_"+testBucket, assignmentqueue.GatewayConsumer)
	if err != nil || !found || st.Pending != 2 || st.AckPending != 0 {
		t.Fatalf("/jsz of the consumer leader %s: %+v, listed %v, %v; want 2 pending", c.Name(leader), st, found, err)
	}
}

// A bucket nats-server will not give expiring markers (here a mirror, on
// which it forbids them) is reported, naming the bucket and the way out,
// and left as it was.
func TestEnsurePayloadsReportsABucketWithoutMarkerTTLs(t *testing.T) {
	ctx := testContext(t)
	js := newJetStream(t)
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ORIGIN", TTL: time.Hour, History: 1, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: testBucket, TTL: time.Hour, History: 1, Storage: jetstream.FileStorage,
		Mirror: &jetstream.StreamSource{Name: "ORIGIN"}}); err != nil {
		t.Fatal(err)
	}
	_, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour}, testKey(1))
	if err == nil {
		t.Fatal("EnsurePayloads gave a mirror expiring markers")
	}
	for _, want := range []string{`"` + testBucket + `"`, "LimitMarkerTTL", "KV_" + testBucket, "upgrade"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if cfg := bucketConfig(t, ctx, js); cfg.LimitMarkerTTL != 0 {
		t.Errorf("refused bucket has marker TTL %v", cfg.LimitMarkerTTL)
	}
}
