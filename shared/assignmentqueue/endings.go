package assignmentqueue

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// EndingsSuffix makes the end-mark bucket's name from the payload bucket's
// (EndingsBucket).
const EndingsSuffix = "_ENDED"

// EndingsBucket names the end-mark bucket of the payload bucket payloadBucket:
// CI_TASKS_ENDED beside CI_TASKS.
func EndingsBucket(payloadBucket string) string { return payloadBucket + EndingsSuffix }

// Endings remembers which assignments are over, in a bucket of their own
// (key: the assignment ID, an empty value), so that a queue message delivered
// again after its task ended creates no second executor (executor.Worker.Accept
// consults it). It holds no payload and no payload key, so handle, which
// needs it, is granted this bucket alone.
//
// A mark lives as long as the bucket keeps values (its TTL, the longest a job
// may run); a message delivered later than that finds no mark, and its
// executor finds no payload and ends at once (recover deletes it).
//
// Ended is answered by the bucket's leader (see placement.go): a mark whose
// write was acknowledged is seen by every later Ended, on one server or on a
// cluster whose leader has just changed. That is why the marks have a bucket
// of their own: a leader read ($JS.API.STREAM.MSG.GET) is granted per stream,
// not per key, and handle's grant must reach no payload.
type Endings struct {
	kv     jetstream.KeyValue
	bucket string
}

// EnsureEndings creates the end-mark bucket b (named EndingsBucket of the
// payload bucket, with its TTL), or converges an existing one, as
// EnsurePayloads does the payload bucket.
func EnsureEndings(ctx context.Context, js jetstream.JetStream, b Bucket) (*Endings, error) {
	kv, err := ensureBucket(ctx, js, b, "end marks", 0)
	if err != nil {
		return nil, err
	}
	return &Endings{kv: kv, bucket: b.Name}, nil
}

// OpenEndings returns the marks of the existing end-mark bucket bucket,
// without changing its configuration. A bucket that still answers reads from
// any replica is refused (ErrDirectReads) until dispatch has converged it.
func OpenEndings(ctx context.Context, js jetstream.JetStream, bucket string) (*Endings, error) {
	kv, err := openBucket(ctx, js, bucket, "end marks")
	if err != nil {
		return nil, err
	}
	return &Endings{kv: kv, bucket: bucket}, nil
}

// MarkEnded records that the task of assignmentID is over. Marking twice is
// harmless. Payloads.Delete leaves the mark in place.
func (e *Endings) MarkEnded(ctx context.Context, assignmentID string) error {
	if assignmentID == "" {
		return fmt.Errorf("end marks %q: mark ended: empty assignment ID", e.bucket)
	}
	if _, err := e.kv.Put(ctx, assignmentID, nil); err != nil {
		return fmt.Errorf("end marks %q: mark assignment %s ended: %w", e.bucket, assignmentID, err)
	}
	return nil
}

// Ended reports whether MarkEnded was called for assignmentID (and the mark
// has not expired).
func (e *Endings) Ended(ctx context.Context, assignmentID string) (bool, error) {
	_, err := e.kv.Get(ctx, assignmentID)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("end marks %q: assignment %s ended: %w", e.bucket, assignmentID, err)
	}
	return true, nil
}
