package jetstreamenv

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// PayloadTTL is how long the payload bucket of a Queue keeps a payload.
const PayloadTTL = time.Hour

// Queue is the assignment queue as dispatch, handle and recover share it, on a
// server of the test's own: on return the stream (assignmentqueue.DefaultStream),
// its rejection stream (EnsureRejections) and the payload bucket (assignmentqueue.DefaultPayloadBucket, PayloadTTL,
// encrypted with Key) exist, and no consumer of the queue's streams does (the
// payload bucket has its assignmentqueue.GatewayConsumer). The queue signs what it
// publishes with Signer, whose public key handle's Keyring must hold. Everything is shut down
// and removed when the test ends.
type Queue struct {
	// Server is the embedded server, at URL; Restart(t, Server) restarts it.
	Server *server.Server
	URL    string
	// Conn and JetStream are the test's connection, which survives Restart.
	Conn      *nats.Conn
	JetStream jetstream.JetStream
	// Queue is the assignment queue on JetStream, signed by Signer.
	Queue *assignmentqueue.Queue
	// Signer signs the assignments Queue publishes; it also opens them, as
	// handle's keyring does.
	Signer *assignmentsig.Signer
	// Payloads is the payload bucket, and Key the key it encrypts with.
	Payloads *assignmentqueue.Payloads
	Key      secretkey.Key
	// Endings is the end-mark bucket beside the payloads.
	Endings *assignmentqueue.Endings
}

// NewQueue starts a server (Start), connects to it (Connect) and ensures the
// queue's stream, its rejection stream, the payload bucket and its end marks. It fails the test if any step fails.
func NewQueue(t testing.TB) *Queue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	q := &Queue{Key: secretkey.Key(bytes.Repeat([]byte{7}, 32))}
	q.Server, q.URL = Start(t)
	q.Conn, q.JetStream = Connect(t, q.URL)
	q.Signer = Signer()
	q.Queue = assignmentqueue.New(q.JetStream, "").SignedBy(q.Signer)
	if err := q.Queue.EnsureStream(ctx); err != nil {
		t.Fatalf("jetstreamenv: ensure stream %s: %v", q.Queue.Stream(), err)
	}
	if err := q.Queue.EnsureRejections(ctx); err != nil {
		t.Fatalf("jetstreamenv: ensure rejection stream %s: %v", q.Queue.RejectionStream(), err)
	}
	var err error
	bucket := assignmentqueue.Bucket{Name: assignmentqueue.DefaultPayloadBucket, TTL: PayloadTTL}
	q.Payloads, err = assignmentqueue.EnsurePayloads(ctx, q.JetStream, bucket, q.Key)
	if err != nil {
		t.Fatalf("jetstreamenv: ensure payload bucket %s: %v", bucket.Name, err)
	}
	bucket.Name = assignmentqueue.EndingsBucket(bucket.Name)
	if q.Endings, err = assignmentqueue.EnsureEndings(ctx, q.JetStream, bucket); err != nil {
		t.Fatalf("jetstreamenv: ensure end-mark bucket %s: %v", bucket.Name, err)
	}
	return q
}

// Signer returns the signer every Queue signs with, from a fixed test key:
// a handler under test authenticates a Queue's messages with it.
func Signer() *assignmentsig.Signer {
	s, err := assignmentsig.NewSigner(secretkey.Key(bytes.Repeat([]byte{8}, 32)))
	if err != nil {
		panic(err) // a 32-byte seed is always a key
	}
	return s
}

// OpenConsumer opens backend b's durable consumer as handle does
// (assignmentqueue.Queue.OpenConsumer, at most capacity messages in flight)
// and fails the test if it cannot.
func (q *Queue) OpenConsumer(t testing.TB, b taskassignment.BackendKind, capacity int) jetstream.Consumer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	c, err := q.Queue.OpenConsumer(ctx, b, capacity)
	if err != nil {
		t.Fatalf("jetstreamenv: open consumer of %s: %v", b, err)
	}
	return c
}
