package assignmentqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Where the queue's data lives on a JetStream cluster, and who answers its
// reads. The code relies on these facts:
//
//   - Every stream and bucket of the queue (the queue stream, its rejection
//     and finish-notice streams, the payload bucket and the end-mark bucket)
//     is kept in ReplicaSettings.Replicas copies; a write is acknowledged once
//     a majority of them has stored it, so an acknowledged write survives the
//     loss of any minority of servers, its stream leader included.
//   - Durable consumers leave their replica count unset and so follow their
//     stream's (the server scales them with it).
//   - Every read whose answer could create, delete or fail something twice is
//     answered by the stream's leader: message gets and stream info on the
//     streams, and key reads on both buckets, which are kept without direct
//     gets (AllowDirect off; see ensureBucket), so a key read is a
//     $JS.API.STREAM.MSG.GET that only the leader answers, never a
//     $JS.API.DIRECT.GET that any replica answers from its own store, a
//     moment behind. A newly elected leader answers only once it has applied
//     every entry of its log up to its election (nats-server's raft reports
//     leadership after that), so a leader read sees every write acknowledged
//     before it was sent.
//   - The one read that any replica may answer is the payload listing
//     (Payloads.IDs, Payloads.Stored: an ordered consumer, which the server
//     places on any caught-up replica). It may be a moment stale: a payload
//     just written may be missing, one just deleted may still be listed.
//     Nothing is decided from it alone: recover confirms every orphan with
//     leader reads and the backend, and a dispatch round that counts one
//     task too few may claim one task past a pool's capacity for that
//     moment, never a task twice.

// ReplicaSettings is embedded in the configuration of the functions that
// create or converge the queue's streams and buckets (dispatch, and handle in
// setup mode).
type ReplicaSettings struct {
	Replicas int `envconfig:"GDR_NATS_REPLICAS" default:"1" desc:"copies JetStream keeps of every stream and bucket dispatch and handle-setup create or converge: 1 on a single server, 3 on a 3-node cluster (1 to 5); dispatch and handle need the same value, or each converges them back to its own"`
}

// MaxReplicas is the most replicas JetStream keeps of a stream.
const MaxReplicas = 5

// Check reports a replica count JetStream does not accept, naming the
// variable.
func (s ReplicaSettings) Check() error {
	if s.Replicas < 1 || s.Replicas > MaxReplicas {
		return fmt.Errorf("GDR_NATS_REPLICAS: %d replicas; JetStream keeps 1 to %d", s.Replicas, MaxReplicas)
	}
	return nil
}

// replicasFor is the replica count to converge a stream to: want when set,
// else what the stream has (have is 0 for a new stream: the server's
// default, one).
func replicasFor(want, have int) int {
	if want > 0 {
		return want
	}
	return have
}

// Bucket is what EnsurePayloads and EnsureEndings converge a key-value
// bucket to.
type Bucket struct {
	// Name is the bucket's name; its stream is "KV_" + Name.
	Name string
	// TTL is how long a value is kept: the longest a job may run. An
	// existing bucket's longer TTL is kept (see EnsurePayloads).
	TTL time.Duration
	// Replicas is the bucket's replica count; 0 keeps an existing bucket's
	// (one for a new bucket).
	Replicas int
}

// ErrDirectReads means a bucket serves reads from any replica (AllowDirect),
// which may answer a moment behind its leader: the queue reads none of its
// buckets that way. dispatch converges its buckets when it starts.
var ErrDirectReads = errors.New("the bucket answers reads from any replica (direct gets); dispatch converges it to leader reads when it starts")

// ensureBucket creates bucket b, or converges an existing one, to file
// storage, one revision per key, b's TTL (never shortened) and replica count,
// and no direct gets, and returns it bound for leader reads. A positive
// markerTTL is the bucket's LimitMarkerTTL: the bucket takes per-message TTLs
// (a purge may leave a marker that expires, jetstream.PurgeTTL) and a value
// expiring at the TTL leaves a marker that lives markerTTL; an existing
// bucket is converged to it (nats-server lets both be turned on in place,
// never off). Zero leaves those settings as they are.
//
// The client library creates a bucket with direct gets on; a bucket is
// therefore created first and then updated to leader reads, and a reader that
// opens it in between is refused (openBucket), never bound to direct gets.
// An existing bucket is converged with a stream update alone, which never
// turns direct gets back on.
func ensureBucket(ctx context.Context, js jetstream.JetStream, b Bucket, what string, markerTTL time.Duration) (jetstream.KeyValue, error) {
	if b.TTL <= 0 {
		return nil, fmt.Errorf("%s %q: TTL %v is not positive", what, b.Name, b.TTL)
	}
	name := "KV_" + b.Name
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.Name, TTL: b.TTL, Storage: jetstream.FileStorage,
			History: 1, Replicas: b.Replicas, LimitMarkerTTL: markerTTL})
		if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
			return nil, fmt.Errorf("%s %q: create bucket: %w: markers that expire (LimitMarkerTTL) need nats-server 2.11 or later", what, b.Name, err)
		}
		if err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return nil, fmt.Errorf("%s %q: create bucket: %w", what, b.Name, err)
		}
		s, err = js.Stream(ctx, name)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", what, b.Name, err)
	}
	have := s.CachedInfo().Config
	if have.Storage != jetstream.FileStorage {
		return nil, fmt.Errorf("%s %q has storage %s, want %s; NATS cannot change the storage of an existing bucket",
			what, b.Name, have.Storage, jetstream.FileStorage)
	}
	want := have
	want.AllowDirect = false
	want.MaxMsgsPerSubject = 1
	want.MaxAge = max(b.TTL, have.MaxAge)
	want.Replicas = replicasFor(b.Replicas, have.Replicas)
	if markerTTL > 0 {
		want.AllowMsgTTL = true
		want.SubjectDeleteMarkerTTL = markerTTL
	}
	if want.AllowDirect != have.AllowDirect || want.MaxMsgsPerSubject != have.MaxMsgsPerSubject ||
		want.MaxAge != have.MaxAge || want.Replicas != have.Replicas ||
		want.AllowMsgTTL != have.AllowMsgTTL || want.SubjectDeleteMarkerTTL != have.SubjectDeleteMarkerTTL {
		s, err := js.UpdateStream(ctx, want)
		if err != nil && markerTTL > 0 && !have.AllowMsgTTL {
			return nil, fmt.Errorf("%s %q: converge bucket to markers that expire (LimitMarkerTTL %v): %w; "+
				"nats-server 2.11 or later turns them on in place: upgrade it, or, once no job runs, delete stream %s and start dispatch again",
				what, b.Name, markerTTL, err, name)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %q: converge bucket: %w", what, b.Name, err)
		}
		// A server older than 2.11 ignores the fields it does not know and
		// answers with the configuration it kept.
		if got := s.CachedInfo().Config; markerTTL > 0 && (!got.AllowMsgTTL || got.SubjectDeleteMarkerTTL != markerTTL) {
			return nil, fmt.Errorf("%s %q: converge bucket: nats-server kept message TTLs %v and marker TTL %v, want true and %v: "+
				"markers that expire (LimitMarkerTTL) need nats-server 2.11 or later; upgrade it, the bucket is then converged in place",
				what, b.Name, got.AllowMsgTTL, got.SubjectDeleteMarkerTTL, markerTTL)
		}
	}
	return openBucket(ctx, js, b.Name, what)
}

// openBucket binds an existing bucket for reads its leader answers; a bucket
// that serves direct gets is refused (ErrDirectReads), since the client
// library would read it from any replica for as long as it is bound. The
// bucket is looked at before it is bound: the queue only ever turns direct
// gets off (ensureBucket), so a bucket seen without them is bound without them.
func openBucket(ctx context.Context, js jetstream.JetStream, bucket, what string) (jetstream.KeyValue, error) {
	s, err := js.Stream(ctx, "KV_"+bucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		err = jetstream.ErrBucketNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", what, bucket, err)
	}
	if s.CachedInfo().Config.AllowDirect {
		return nil, fmt.Errorf("%s %q: %w", what, bucket, ErrDirectReads)
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", what, bucket, err)
	}
	return kv, nil
}
