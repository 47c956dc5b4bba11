package assignmentqueue

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// endedPrefix marks, in the payload bucket, an assignment whose task is over.
// Like startedPrefix, no payload ID starts with it (pool names have no dot).
const endedPrefix = "ended."

// Endings remembers which assignments are over, in the payload bucket beside
// the payloads (key "ended.<assignment ID>", an empty value), so that a queue
// message delivered again after its task ended creates no second executor
// (executor.Worker.Accept consults it). It reads and writes marks only:
// it holds no payload key and never reads a payload, so handle, which needs
// it, gets a NATS grant for the "ended." keys alone.
//
// A mark lives as long as the bucket keeps values (its TTL, the longest a job
// may run); a message delivered later than that finds no mark, and its
// executor finds no payload and ends at once (recover deletes it).
//
// Reads go through the bucket's direct get. On a bucket with one replica
// they see every completed write; with replicas a follower may answer a
// moment behind its leader.
type Endings struct {
	kv     jetstream.KeyValue
	bucket string
}

// OpenEndings returns the marks of an existing payload bucket, without
// changing its configuration.
func OpenEndings(ctx context.Context, js jetstream.JetStream, bucket string) (*Endings, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("payload store %q: %w", bucket, err)
	}
	return &Endings{kv: kv, bucket: bucket}, nil
}

// Endings returns the end marks of p's bucket.
func (p *Payloads) Endings() *Endings { return &Endings{kv: p.kv, bucket: p.bucket} }

// MarkEnded records that the task of assignmentID is over. Marking twice is
// harmless. Payloads.Delete leaves the mark in place.
func (e *Endings) MarkEnded(ctx context.Context, assignmentID string) error {
	if assignmentID == "" {
		return fmt.Errorf("payload store %q: mark ended: empty assignment ID", e.bucket)
	}
	if _, err := e.kv.Put(ctx, endedPrefix+assignmentID, nil); err != nil {
		return fmt.Errorf("payload store %q: mark assignment %s ended: %w", e.bucket, assignmentID, err)
	}
	return nil
}

// Ended reports whether MarkEnded was called for assignmentID (and the mark
// has not expired).
func (e *Endings) Ended(ctx context.Context, assignmentID string) (bool, error) {
	_, err := e.kv.Get(ctx, endedPrefix+assignmentID)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("payload store %q: assignment %s ended: %w", e.bucket, assignmentID, err)
	}
	return true, nil
}
