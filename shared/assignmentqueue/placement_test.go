package assignmentqueue_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
)

// Both buckets are created for leader reads (no direct gets), and a bucket an
// earlier version left with direct gets is refused by the readers until
// Ensure converges it, its values kept. A reader bound to direct gets would
// read from any replica for as long as it runs.
func TestBucketsAreReadThroughTheirLeader(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bucket string
		ensure func(t *testing.T, js jetstream.JetStream, b assignmentqueue.Bucket) error
		open   func(t *testing.T, js jetstream.JetStream, bucket string) error
	}{
		{"payloads", testBucket,
			func(t *testing.T, js jetstream.JetStream, b assignmentqueue.Bucket) error {
				_, err := assignmentqueue.EnsurePayloads(testContext(t), js, b, testKey(1))
				return err
			},
			func(t *testing.T, js jetstream.JetStream, bucket string) error {
				_, err := assignmentqueue.OpenPayloads(testContext(t), js, bucket, testKey(1))
				return err
			}},
		{"end marks", assignmentqueue.EndingsBucket(testBucket),
			func(t *testing.T, js jetstream.JetStream, b assignmentqueue.Bucket) error {
				_, err := assignmentqueue.EnsureEndings(testContext(t), js, b)
				return err
			},
			func(t *testing.T, js jetstream.JetStream, bucket string) error {
				_, err := assignmentqueue.OpenEndings(testContext(t), js, bucket)
				return err
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			js := newJetStream(t)
			// As an earlier version (or the client library's defaults) made it.
			raw, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: tc.bucket, TTL: time.Hour, History: 1, Storage: jetstream.FileStorage})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := raw.Put(ctx, "kept", []byte{1}); err != nil {
				t.Fatal(err)
			}
			if !allowDirect(t, js, tc.bucket) {
				t.Fatal("the client library made a bucket without direct gets: the refusal below would test nothing")
			}
			if err := tc.open(t, js, tc.bucket); !errors.Is(err, assignmentqueue.ErrDirectReads) || !strings.Contains(err.Error(), tc.bucket) {
				t.Fatalf("open a bucket with direct gets: %v; want ErrDirectReads naming %s", err, tc.bucket)
			}
			if err := tc.ensure(t, js, assignmentqueue.Bucket{Name: tc.bucket, TTL: 30 * time.Minute, Replicas: 1}); err != nil {
				t.Fatal(err)
			}
			if allowDirect(t, js, tc.bucket) {
				t.Fatal("Ensure left direct gets on")
			}
			st, err := js.Stream(ctx, "KV_"+tc.bucket)
			if err != nil {
				t.Fatal(err)
			}
			if cfg := st.CachedInfo().Config; cfg.MaxAge != time.Hour || cfg.MaxMsgsPerSubject != 1 || cfg.Replicas != 1 {
				t.Errorf("converged: TTL %v (want the longer 1h kept), history %d, replicas %d", cfg.MaxAge, cfg.MaxMsgsPerSubject, cfg.Replicas)
			}
			if err := tc.open(t, js, tc.bucket); err != nil {
				t.Fatalf("open after Ensure: %v", err)
			}
			// A reader bound to direct gets before the convergence fails from then
			// on (no replica answers direct gets), never reads stale; bound again,
			// it reads the value written before.
			if _, err := raw.Get(ctx, "kept"); err == nil {
				t.Error("a reader bound to direct gets still reads after the convergence")
			}
			again, err := js.KeyValue(ctx, tc.bucket)
			if err != nil {
				t.Fatal(err)
			}
			if e, err := again.Get(ctx, "kept"); err != nil || e.Value()[0] != 1 {
				t.Fatalf("a value written before the convergence: %v, %v", e, err)
			}
			// A new bucket is made for leader reads from the start.
			fresh := tc.bucket + "_NEW"
			if err := tc.ensure(t, js, assignmentqueue.Bucket{Name: fresh, TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if allowDirect(t, js, fresh) {
				t.Fatal("a new bucket serves direct gets")
			}
			if err := tc.ensure(t, js, assignmentqueue.Bucket{Name: fresh}); err == nil {
				t.Error("Ensure without a TTL succeeded")
			}
		})
	}
}

func allowDirect(t *testing.T, js jetstream.JetStream, bucket string) bool {
	t.Helper()
	s, err := js.Stream(testContext(t), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().Config.AllowDirect
}

func TestReplicaSettingsCheck(t *testing.T) {
	for n, ok := range map[int]bool{-1: false, 0: false, 1: true, 3: true, 5: true, 6: false} {
		err := assignmentqueue.ReplicaSettings{Replicas: n}.Check()
		if (err == nil) != ok {
			t.Errorf("Check(%d) = %v; want ok=%v", n, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "GDR_NATS_REPLICAS") {
			t.Errorf("Check(%d) = %q does not name the variable", n, err)
		}
	}
}
