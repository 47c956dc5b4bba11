package assignmentqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Finish notices tell recover that an executor's runner has reported its
// task's final result, so that the executor is reported, deleted and its slot
// freed within seconds instead of on recover's next pass.
//
// They are one work-queue stream, named after the queue's stream with
// FinishedSuffix, with one subject per backend, ci.finished.<backend>, and
// one durable pull consumer per backend, named after it. A notice's body is
// the assignment ID alone, published with the assignment ID as its
// Nats-Msg-Id, so the runner's retried final report within DuplicateWindow
// stores one notice.
//
// A notice is unauthenticated data and carries nothing secret. It is
// harmless: recover acts on a notice only through recoverer.Finish, which acts
// only on facts it reads itself from Gitea and the backend. A forged notice,
// or one for a task that is not over, causes one early check of one executor
// and changes nothing. A lost notice costs only time: recover's periodic pass
// is the safety net.
const (
	// FinishedSuffix makes the notices' stream name from the queue's.
	FinishedSuffix = "_FINISHED"
	// FinishedSubjectPrefix is the subject prefix of finish notices; a notice
	// for backend b is published on FinishedSubjectPrefix + "." + b.
	FinishedSubjectPrefix = "ci.finished"
	// FinishedMaxAge bounds how long a notice is kept: one older than that is
	// worth nothing more than recover's periodic pass.
	FinishedMaxAge = 15 * time.Minute
	// FinishedAckWait is how long a delivered notice stays with its receiver
	// before it is delivered again. One Finish takes a few API calls.
	FinishedAckWait = time.Minute
	// finishedMaxAckPending caps the notices of one backend out at once.
	finishedMaxAckPending = 256
)

// FinishedSubject returns the subject of finish notices for backend b:
// "ci.finished.<b>".
func FinishedSubject(b taskassignment.BackendKind) string {
	return FinishedSubjectPrefix + "." + string(b)
}

// Finished is the stream of finish notices. It holds nothing but its
// JetStream context and stream name, and is safe for concurrent use.
type Finished struct {
	js       jetstream.JetStream
	stream   string
	replicas int
}

// NewFinished returns the finish notices of the queue stream queueStream
// (empty: DefaultStream), in stream queueStream + FinishedSuffix. It contacts
// no server.
func NewFinished(js jetstream.JetStream, queueStream string) *Finished {
	if queueStream == "" {
		queueStream = DefaultStream
	}
	return &Finished{js: js, stream: queueStream + FinishedSuffix}
}

// Replicated returns the notices that create their stream with n replicas and
// converge an existing one to n, as Queue.Replicated does the queue's.
func (f *Finished) Replicated(n int) *Finished {
	c := *f
	c.replicas = n
	return &c
}

// Stream returns the name of the notices' stream.
func (f *Finished) Stream() string { return f.stream }

func (f *Finished) streamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       f.stream,
		Subjects:   []string{FinishedSubjectPrefix + ".>"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.WorkQueuePolicy,
		Duplicates: DuplicateWindow,
		MaxAge:     FinishedMaxAge,
	}
}

func finishedConsumerConfig(b taskassignment.BackendKind) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       string(b),
		FilterSubject: FinishedSubject(b),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       FinishedAckWait,
		MaxDeliver:    taskassignment.FinishedMaxDeliver,
		MaxAckPending: finishedMaxAckPending,
	}
}

// Ensure creates the notices' stream, or brings an existing one back to its
// configuration (subjects ci.finished.>, file storage, work-queue retention,
// DuplicateWindow, FinishedMaxAge, the replica count of Replicated; unset, an
// existing stream keeps its own), then the durable consumer of each backend in
// consumers. It is idempotent and safe to run from several processes at once.
// As with EnsureStream, a stream with another retention or storage is left
// unchanged and reported.
func (f *Finished) Ensure(ctx context.Context, consumers ...taskassignment.BackendKind) error {
	want := f.streamConfig()
	s, err := f.js.Stream(ctx, f.stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return fmt.Errorf("finish notices: stream %q: %w", f.stream, err)
	default:
		have := s.CachedInfo().Config
		if have.Retention != want.Retention || have.Storage != want.Storage {
			return fmt.Errorf("finish notices: stream %q has retention %s and storage %s, want %s and %s; NATS cannot change either of an existing stream",
				f.stream, have.Retention, have.Storage, want.Retention, want.Storage)
		}
		want.Replicas = have.Replicas
	}
	want.Replicas = replicasFor(f.replicas, want.Replicas)
	if _, err := f.js.CreateOrUpdateStream(ctx, want); err != nil {
		return fmt.Errorf("finish notices: ensure stream %q: %w", f.stream, err)
	}
	for _, b := range consumers {
		if err := checkBackend(b); err != nil {
			return fmt.Errorf("finish notices: stream %q: consumer: %w", f.stream, err)
		}
		if _, err := f.js.CreateOrUpdateConsumer(ctx, f.stream, finishedConsumerConfig(b)); err != nil {
			return fmt.Errorf("finish notices: stream %q: ensure consumer %q: %w", f.stream, b, err)
		}
	}
	return nil
}

// Consumer returns the existing durable consumer of backend b without
// changing it (Ensure creates it). It wraps jetstream.ErrConsumerNotFound when
// there is none.
func (f *Finished) Consumer(ctx context.Context, b taskassignment.BackendKind) (jetstream.Consumer, error) {
	if err := checkBackend(b); err != nil {
		return nil, fmt.Errorf("finish notices: stream %q: consumer: %w", f.stream, err)
	}
	c, err := f.js.Consumer(ctx, f.stream, string(b))
	if err != nil {
		return nil, fmt.Errorf("finish notices: stream %q: consumer %q: %w", f.stream, b, err)
	}
	return c, nil
}

// Publish sends the finish notice of assignmentID, whose executor runs on
// backend b. It names no stream (the publisher needs no stream name or stream
// rights): whichever stream captures ci.finished.> stores it, and with none
// the publish fails (no responders). A notice of the same assignment stored
// less than DuplicateWindow ago makes this one a no-op. An unknown backend or
// an ID that is not an assignment ID is refused before anything is sent.
func (f *Finished) Publish(ctx context.Context, b taskassignment.BackendKind, assignmentID string) error {
	if err := checkBackend(b); err != nil {
		return fmt.Errorf("finish notices: publish notice of %s: %w", assignmentID, err)
	}
	if _, _, err := taskassignment.ParseID(assignmentID); err != nil {
		return fmt.Errorf("finish notices: publish notice: %w", err)
	}
	if _, err := f.js.Publish(ctx, FinishedSubject(b), []byte(assignmentID), jetstream.WithMsgID(assignmentID)); err != nil {
		return fmt.Errorf("finish notices: publish notice of %s: %w", assignmentID, err)
	}
	return nil
}
