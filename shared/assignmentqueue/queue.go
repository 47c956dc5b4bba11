// Package assignmentqueue carries assignments from dispatch to backends over
// NATS JetStream, and keeps each assignment's full task, sealed, beside it.
//
// The queue is one work-queue stream with one subject per backend,
// ci.assignment.<backend>, and one durable pull consumer per backend. A
// message is an assignment encoded by taskassignment.Encode, published with
// the assignment ID as its Nats-Msg-Id. It stays in the stream until its
// consumer acknowledges or terminates it.
//
// The assignment message holds nothing secret; the task it points at
// (token, secrets, workflow) is in the payload store (see Payloads) under the
// same assignment ID, encrypted and authenticated.
package assignmentqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

const (
	// DefaultStream is the stream New uses when given none.
	DefaultStream = "CI_RUNNER"
	// SubjectPrefix is the subject prefix of the queue; an assignment for
	// backend b is published on SubjectPrefix + "." + b.
	SubjectPrefix = "ci.assignment"
	// DuplicateWindow is the stream's deduplication window: a message whose
	// Nats-Msg-Id was stored less than this long ago is dropped.
	DuplicateWindow = 2 * time.Minute
	// AckWait is how long a delivered, unacknowledged message stays with its
	// receiver before it is delivered again. A consumer holding a message
	// longer must signal progress (InProgress) or it loses it.
	AckWait = 5 * time.Minute
)

// Subject returns the subject that assignments for backend b are published
// on: "ci.assignment.<b>".
func Subject(b taskassignment.BackendKind) string {
	return SubjectPrefix + "." + string(b)
}

// streamSubjects are the subjects of the queue stream.
func streamSubjects() []string { return []string{SubjectPrefix + ".>"} }

// Signer signs what Publish writes and authenticates what Queued reads back
// (assignmentsig.Signer).
type Signer interface {
	Seal(msg []byte) ([]byte, error)
	Open(sealed []byte) ([]byte, error)
}

// Queue is the assignment queue in one stream. It holds no state besides its
// JetStream context, stream name and signer, and is safe for concurrent use.
type Queue struct {
	js       jetstream.JetStream
	stream   string
	signer   Signer
	replicas int
}

// New returns the queue in stream of js; an empty stream means DefaultStream.
// It contacts no server: call EnsureStream to create the stream.
func New(js jetstream.JetStream, stream string) *Queue {
	if stream == "" {
		stream = DefaultStream
	}
	return &Queue{js: js, stream: stream}
}

// SignedBy returns the queue that signs what it publishes with s, and counts
// only messages s authenticates as queued. A queue without a signer creates
// streams and consumers but publishes nothing: no assignment is ever
// written unsigned.
func (q *Queue) SignedBy(s Signer) *Queue {
	c := *q
	c.signer = s
	return &c
}

// Replicated returns the queue that creates its streams with n replicas and
// converges existing ones to n (see placement.go); without it (or with 0) an
// existing stream keeps the replica count it has.
func (q *Queue) Replicated(n int) *Queue {
	c := *q
	c.replicas = n
	return &c
}

// Stream returns the name of the queue's stream.
func (q *Queue) Stream() string { return q.stream }

// streamConfig is the configuration EnsureStream converges the stream to.
func (q *Queue) streamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       q.stream,
		Subjects:   streamSubjects(),
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.WorkQueuePolicy,
		Duplicates: DuplicateWindow,
	}
}

// EnsureStream creates the queue's stream, or brings an existing one back to
// the queue's configuration: subjects ci.assignment.>, file storage,
// work-queue retention, a DuplicateWindow deduplication window and the
// queue's replica count (Replicated; unset: an existing stream keeps its
// own). Every other setting is reset to its default. It is idempotent and safe
// to run from several processes at once.
//
// Retention is WorkQueuePolicy: a message is removed from the stream as soon
// as its consumer acknowledges or terminates it, so the stream holds exactly
// the assignments that are not yet done. That bounds the stream's size by
// outstanding work and makes Queued a scan of outstanding work only. Work-queue
// retention requires consumers with disjoint filters and explicit acks, which
// the per-backend consumers are; it refuses any other consumer on their
// subjects, ordered consumers included, so a reader that must not consume
// (Queued) reads messages directly rather than through a consumer.
// Deduplication by Nats-Msg-Id still applies within the window, with one
// caveat: a message acknowledged less than DuplicateWindow after it was first
// stored still blocks a re-publish of the same assignment ID until the window
// has passed; that re-publish returns Duplicate and stores nothing.
//
// NATS cannot change the retention policy or the storage type of an existing
// stream. If the stream has another of either, EnsureStream changes nothing
// and returns an error naming the stream and both values; the stream must be
// removed (losing the assignments it holds) or the queue pointed at another
// stream name.
func (q *Queue) EnsureStream(ctx context.Context) error {
	want := q.streamConfig()
	s, err := q.js.Stream(ctx, q.stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return fmt.Errorf("assignment queue: stream %q: %w", q.stream, err)
	default:
		have := s.CachedInfo().Config
		if have.Retention != want.Retention {
			return fmt.Errorf("assignment queue: stream %q has retention %s, want %s; NATS cannot change the retention of an existing stream",
				q.stream, have.Retention, want.Retention)
		}
		if have.Storage != want.Storage {
			return fmt.Errorf("assignment queue: stream %q has storage %s, want %s; NATS cannot change the storage of an existing stream",
				q.stream, have.Storage, want.Storage)
		}
		want.Replicas = have.Replicas
	}
	want.Replicas = replicasFor(q.replicas, want.Replicas)
	if _, err := q.js.CreateOrUpdateStream(ctx, want); err != nil {
		return fmt.Errorf("assignment queue: ensure stream %q: %w", q.stream, err)
	}
	return nil
}

// checkBackend returns an error naming b if it is not a known backend; a
// consumer name or subject built from an unknown one could address anything.
func checkBackend(b taskassignment.BackendKind) error {
	_, err := taskassignment.ParseBackendKind(string(b))
	return err
}

// consumerConfig is the configuration OpenConsumer converges a backend's
// consumer to.
func consumerConfig(b taskassignment.BackendKind, maxInFlight int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       string(b),
		FilterSubject: Subject(b),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       AckWait,
		MaxDeliver:    taskassignment.MaxDeliver,
		MaxAckPending: maxInFlight,
	}
}

// OpenConsumer creates the durable pull consumer of backend b, named after b
// and filtered to Subject(b), or brings an existing one back to that
// configuration. At most maxInFlight messages are delivered and
// unacknowledged at once; the server holds back the rest. Every message is delivered, from
// the oldest in the stream; an unacknowledged one comes back after AckWait, up
// to MaxDeliver times. maxInFlight below 1 is an error. It is idempotent; calling
// it with another maxInFlight changes the limit in place without losing messages
// or deliveries in flight.
func (q *Queue) OpenConsumer(ctx context.Context, b taskassignment.BackendKind, maxInFlight int) (jetstream.Consumer, error) {
	if err := checkBackend(b); err != nil {
		return nil, fmt.Errorf("assignment queue: stream %q: consumer: %w", q.stream, err)
	}
	if maxInFlight < 1 {
		return nil, fmt.Errorf("assignment queue: stream %q: consumer %q: max in flight %d is below 1", q.stream, b, maxInFlight)
	}
	c, err := q.js.CreateOrUpdateConsumer(ctx, q.stream, consumerConfig(b, maxInFlight))
	if err != nil {
		return nil, fmt.Errorf("assignment queue: stream %q: open consumer %q: %w", q.stream, b, err)
	}
	return c, nil
}

// Consumer returns the existing consumer of backend b without changing its
// configuration, so a reader never undoes what OpenConsumer set. It wraps
// jetstream.ErrConsumerNotFound if OpenConsumer has not created it.
func (q *Queue) Consumer(ctx context.Context, b taskassignment.BackendKind) (jetstream.Consumer, error) {
	if err := checkBackend(b); err != nil {
		return nil, fmt.Errorf("assignment queue: stream %q: consumer: %w", q.stream, err)
	}
	c, err := q.js.Consumer(ctx, q.stream, string(b))
	if err != nil {
		return nil, fmt.Errorf("assignment queue: stream %q: consumer %q: %w", q.stream, b, err)
	}
	return c, nil
}

// Publish queues a for its backend: the message is taskassignment.Encode(a)
// on Subject(a.Backend) with a.ID as Nats-Msg-Id, and is accepted only by the
// queue's stream. When a message with the same ID was stored less than
// DuplicateWindow ago, nothing is stored and the returned PubAck has
// Duplicate set; publishing the same assignment again is therefore safe. An
// unknown backend or an empty ID is refused before anything is sent.
func (q *Queue) Publish(ctx context.Context, a taskassignment.Assignment) (*jetstream.PubAck, error) {
	if a.ID == "" {
		return nil, fmt.Errorf("assignment queue: stream %q: publish: assignment of task %d has no ID", q.stream, a.Task.ID)
	}
	if err := checkBackend(a.Backend); err != nil {
		return nil, fmt.Errorf("assignment queue: stream %q: publish assignment %s: %w", q.stream, a.ID, err)
	}
	if q.signer == nil {
		return nil, fmt.Errorf("assignment queue: stream %q: publish assignment %s: refused, the queue has no signing key", q.stream, a.ID)
	}
	msg, err := taskassignment.Encode(a)
	if err != nil {
		return nil, fmt.Errorf("assignment queue: stream %q: encode assignment %s: %w", q.stream, a.ID, err)
	}
	data, err := q.signer.Seal(msg)
	if err != nil {
		return nil, fmt.Errorf("assignment queue: stream %q: sign assignment %s: %w", q.stream, a.ID, err)
	}
	ack, err := q.js.Publish(ctx, Subject(a.Backend), data,
		jetstream.WithMsgID(a.ID), jetstream.WithExpectStream(q.stream))
	if err != nil {
		return nil, fmt.Errorf("assignment queue: stream %q: publish assignment %s: %w", q.stream, a.ID, err)
	}
	return ack, nil
}

// Send is Publish for callers that need only to know the assignment is
// queued (dispatch and recover, through a narrow interface they share with
// the CloudEvents sender of the Knative path): a duplicate within the window
// is queued already, hence no error.
func (q *Queue) Send(ctx context.Context, a taskassignment.Assignment) error {
	_, err := q.Publish(ctx, a)
	return err
}

// Outstanding returns how many messages backend b's consumer has not yet
// finished: those not yet delivered plus those delivered and not yet
// acknowledged. The consumer's max in flight minus Outstanding is what the backend
// can still take.
// A message past MaxDeliver is in neither count. The figure may lag a publish
// by a moment (the consumer counts a stored message asynchronously), so it can
// understate use for an instant; the consumer's MaxAckPending is what enforces
// the cap. The consumer must exist.
func (q *Queue) Outstanding(ctx context.Context, b taskassignment.BackendKind) (int, error) {
	c, err := q.Consumer(ctx, b)
	if err != nil {
		return 0, err
	}
	info := c.CachedInfo()
	return int(info.NumPending) + info.NumAckPending, nil
}

// Queued returns the IDs of the assignments of backend b still in the stream:
// with work-queue retention, those published and neither acknowledged nor
// terminated, including any past MaxDeliver. Messages on Subject(b) that the
// queue's signer does not authenticate (forged ones), that do not decode in
// trust domain td, or that decode to another backend, are left out and
// counted in malformed; they are not an error. A queue without a signer
// cannot tell, and fails.
//
// It reads messages one by one from the stream leader without creating a
// consumer, so it neither delivers nor acknowledges anything and works with
// the backend consumers in place; it costs one request per queued message of
// b. Every message stored before the call and still stored after it is
// reported; messages published during the call are not, and messages removed
// during the call may or may not be.
func (q *Queue) Queued(ctx context.Context, b taskassignment.BackendKind, td spiffeid.TrustDomain) (ids map[string]bool, malformed int, err error) {
	if err := checkBackend(b); err != nil {
		return nil, 0, fmt.Errorf("assignment queue: stream %q: queued: %w", q.stream, err)
	}
	if q.signer == nil {
		return nil, 0, fmt.Errorf("assignment queue: stream %q: queued: the queue has no key to authenticate messages with", q.stream)
	}
	subject := Subject(b)
	s, err := q.js.Stream(ctx, q.stream)
	if err != nil {
		return nil, 0, fmt.Errorf("assignment queue: stream %q: queued %s: %w", q.stream, subject, err)
	}
	state := s.CachedInfo().State
	last := state.LastSeq
	ids = make(map[string]bool)
	for seq := max(state.FirstSeq, 1); seq <= last; seq++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("assignment queue: stream %q: queued %s: read from sequence %d: %w", q.stream, subject, seq, err)
		}
		if m.Sequence > last {
			break
		}
		seq = m.Sequence
		msg, err := q.signer.Open(m.Data)
		if err != nil {
			malformed++ // forged, or signed by a key this queue does not hold
			continue
		}
		a, err := taskassignment.Decode(msg, td)
		if err != nil || a.Backend != b {
			malformed++
			continue
		}
		ids[a.ID] = true
	}
	return ids, malformed, nil
}
