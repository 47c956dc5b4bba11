package assignmentqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Rejections: the queue's dead letters, kept until recover has acted on them.
//
// handle ends a message it can never accept with a termination whose reason
// names the assignment (RejectedReason, ExhaustedReason). The server then
// publishes an advisory, which by itself goes nowhere: the capture stream
// (RejectionStream) stores two kinds of them for the queue's stream, and
// nothing else:
//
//   - $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>: a
//     message was terminated, with handle's reason;
//   - $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>: a
//     message reached MaxDeliver without a termination (a handle killed on
//     its last delivery); the message itself stays in the queue's stream.
//
// The capture stream keeps an entry until it is removed (RemoveRejection):
// no age or count limit drops one, so an entry outlives any crash of recover
// and is removed only once recover has acted on it. Acting twice on one
// entry is harmless (every step of recover is idempotent), so the order is
// act, then remove.
//
// Crash window: an advisory is published by the server once, when the
// message is terminated, at most once and without acknowledgement: it is
// stored only if the capture stream exists and can store it at that moment
// (EnsureRejections runs wherever the queue's stream is ensured). A
// termination whose advisory is lost leaves a payload with neither message
// nor executor: an orphan that recover re-publishes, and that handle then
// rejects again, this time captured.

const (
	// RejectionStreamSuffix makes the capture stream's name from the queue
	// stream's: CI_RUNNER -> CI_RUNNER_REJECTED.
	RejectionStreamSuffix = "_REJECTED"

	terminatedAdvisoryPrefix    = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED"
	maxDeliveriesAdvisoryPrefix = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
)

// RejectionStream returns the name of the queue's capture stream.
func (q *Queue) RejectionStream() string { return q.stream + RejectionStreamSuffix }

// rejectionSubjects are the advisory subjects the capture stream stores: the
// two kinds above, of every consumer of the queue's stream, and no other
// stream's.
func (q *Queue) rejectionSubjects() []string {
	return []string{
		terminatedAdvisoryPrefix + "." + q.stream + ".*",
		maxDeliveriesAdvisoryPrefix + "." + q.stream + ".*",
	}
}

func (q *Queue) rejectionConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        q.RejectionStream(),
		Description: "terminations and exhausted deliveries of " + q.stream + ", until recover has acted on them",
		Subjects:    q.rejectionSubjects(),
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		// An entry goes when recover has acted on it, or after
		// RejectionMaxAge: one recover cannot act on (a pool it does not
		// know, a task Gitea keeps refusing) must not stay for ever, ahead
		// of newer ones in every pass's read.
		MaxAge: RejectionMaxAge,
	}
}

// RejectionMaxAge is how long an entry stays in the capture stream when no
// recover removes it: far longer than a payload lives (the bucket's TTL, the
// longest job), after which nothing is left to act on.
const RejectionMaxAge = 7 * 24 * time.Hour

// EnsureRejections creates the queue's capture stream, or brings an existing
// one back to its configuration (the advisory subjects of the queue's
// stream, file storage, limits retention with RejectionMaxAge, the queue's
// replica count (Replicated; unset, an existing stream keeps its own). It is idempotent and
// safe to run from several processes at once. A capture stream with another
// storage type is an error: NATS cannot change it in place.
func (q *Queue) EnsureRejections(ctx context.Context) error {
	want := q.rejectionConfig()
	s, err := q.js.Stream(ctx, want.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return fmt.Errorf("assignment queue: rejection stream %q: %w", want.Name, err)
	default:
		have := s.CachedInfo().Config
		if have.Storage != want.Storage {
			return fmt.Errorf("assignment queue: rejection stream %q has storage %s, want %s; NATS cannot change the storage of an existing stream",
				want.Name, have.Storage, want.Storage)
		}
		want.Replicas = have.Replicas
	}
	want.Replicas = replicasFor(q.replicas, want.Replicas)
	if _, err := q.js.CreateOrUpdateStream(ctx, want); err != nil {
		return fmt.Errorf("assignment queue: ensure rejection stream %q: %w", want.Name, err)
	}
	return nil
}

// advisory is the part of the two advisories Rejections reads. Its fields
// are those of nats-server's JSConsumerDeliveryTerminatedAdvisory (schema
// io.nats.jetstream.advisory.v1.terminated) and
// JSConsumerDeliveryExceededAdvisory (io.nats.jetstream.advisory.v1.
// max_deliver), decoded here so that the functions do not link the server.
type advisory struct {
	Type       string `json:"type"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason,omitempty"`
}

const (
	terminatedAdvisoryType    = "io.nats.jetstream.advisory.v1.terminated"
	maxDeliveriesAdvisoryType = "io.nats.jetstream.advisory.v1.max_deliver"
)

// Rejections returns up to limit entries of the capture stream, oldest
// first (limit 0: all stored when the call starts). It reads without a
// consumer and removes nothing: an entry stays until RemoveRejection. An
// entry that does not decode is returned with Err set.
func (q *Queue) Rejections(ctx context.Context, limit int) ([]taskassignment.Rejection, error) {
	name := q.RejectionStream()
	s, err := q.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("assignment queue: rejection stream %q: %w", name, err)
	}
	state := s.CachedInfo().State
	var out []taskassignment.Rejection
	for seq := max(state.FirstSeq, 1); seq <= state.LastSeq && (limit <= 0 || len(out) < limit); seq++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("assignment queue: rejection stream %q: read from sequence %d: %w", name, seq, err)
		}
		if m.Sequence > state.LastSeq {
			break
		}
		seq = m.Sequence
		out = append(out, q.decodeRejection(m))
	}
	return out, nil
}

func (q *Queue) decodeRejection(m *jetstream.RawStreamMsg) taskassignment.Rejection {
	r := taskassignment.Rejection{Seq: m.Sequence}
	var a advisory
	if err := json.Unmarshal(m.Data, &a); err != nil {
		r.Err = fmt.Errorf("entry %d on %s: %w", m.Sequence, m.Subject, err)
		return r
	}
	switch {
	case a.Type == terminatedAdvisoryType && strings.HasPrefix(m.Subject, terminatedAdvisoryPrefix+"."):
		r.Kind = taskassignment.Terminated
	case a.Type == maxDeliveriesAdvisoryType && strings.HasPrefix(m.Subject, maxDeliveriesAdvisoryPrefix+"."):
		r.Kind = taskassignment.MaxDeliveries
	default:
		r.Err = fmt.Errorf("entry %d on %s: advisory type %q", m.Sequence, m.Subject, a.Type)
		return r
	}
	if a.Stream != q.stream || a.Consumer == "" || !strings.HasSuffix(m.Subject, "."+q.stream+"."+a.Consumer) {
		r.Err = fmt.Errorf("entry %d on %s: advisory of stream %q, consumer %q", m.Sequence, m.Subject, a.Stream, a.Consumer)
		r.Kind = ""
		return r
	}
	r.Consumer, r.QueueSeq, r.Deliveries, r.Reason = a.Consumer, a.StreamSeq, a.Deliveries, a.Reason
	return r
}

// RemoveRejection removes entry seq of the capture stream; one already gone
// is removed.
func (q *Queue) RemoveRejection(ctx context.Context, seq uint64) error {
	return q.deleteMsg(ctx, q.RejectionStream(), seq)
}

// ExhaustedAssignment reads message seq of the queue's stream, the one a
// MaxDeliveries rejection names, and returns its assignment, authenticated
// by the queue's signer and decoded in trust domain td. found is false when
// the message is gone; a message that does not authenticate or decode is an
// error wrapping taskassignment.ErrNotAnAssignment.
func (q *Queue) ExhaustedAssignment(ctx context.Context, seq uint64, td spiffeid.TrustDomain) (a taskassignment.Assignment, found bool, err error) {
	if q.signer == nil {
		return a, false, fmt.Errorf("assignment queue: stream %q: read message %d: the queue has no key to authenticate messages with", q.stream, seq)
	}
	s, err := q.js.Stream(ctx, q.stream)
	if err != nil {
		return a, false, fmt.Errorf("assignment queue: stream %q: %w", q.stream, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return a, false, nil
	}
	if err != nil {
		return a, false, fmt.Errorf("assignment queue: stream %q: read message %d: %w", q.stream, seq, err)
	}
	msg, err := q.signer.Open(m.Data)
	if err != nil {
		return a, true, fmt.Errorf("assignment queue: stream %q: message %d: %w: %w", q.stream, seq, taskassignment.ErrNotAnAssignment, err)
	}
	if a, err = taskassignment.Decode(msg, td); err != nil {
		return a, true, fmt.Errorf("assignment queue: stream %q: message %d: %w: %w", q.stream, seq, taskassignment.ErrNotAnAssignment, err)
	}
	return a, true, nil
}

// DeleteMessage removes message seq from the queue's stream (a message past
// MaxDeliver, which no consumer delivers again); one already gone is
// removed.
func (q *Queue) DeleteMessage(ctx context.Context, seq uint64) error {
	return q.deleteMsg(ctx, q.stream, seq)
}

func (q *Queue) deleteMsg(ctx context.Context, stream string, seq uint64) error {
	s, err := q.js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("assignment queue: stream %q: %w", stream, err)
	}
	err = s.DeleteMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		// The server answers a message already gone with an error whose
		// code it shares with other failures: look whether it is gone.
		if _, gerr := s.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("assignment queue: stream %q: delete message %d: %w", stream, seq, err)
	}
	return nil
}
