package pull

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// A message that keeps failing comes back later each time, and on its last
// delivery it is terminated rather than naked: a naked one would stay in
// the stream, never delivered again and counted as queued, so recover would
// never re-publish it and the job would hang until its payload expired.
func TestJobBacksOffAndTerminatesOnTheLastDelivery(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	const maxDeliver = 3
	c, err := env.JetStream.CreateOrUpdateConsumer(context.Background(), assignmentqueue.DefaultStream, jetstream.ConsumerConfig{
		Durable: string(taskassignment.BackendProcess), FilterSubject: assignmentqueue.Subject(taskassignment.BackendProcess),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxDeliver: maxDeliver, MaxAckPending: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	a := handlertest.Assignment(t, 9)
	publish(t, env.Queue, a)
	failing := handlertest.AcceptFunc(func(context.Context, taskassignment.Assignment) (bool, error) {
		return false, errors.New("backend unavailable")
	})
	const base = 300 * time.Millisecond
	var lastRun time.Time
	for delivery := 1; delivery <= maxDeliver; delivery++ {
		j := job(c, failing, nil)
		setDelays(&j, 0, base)
		j.MaxDeliver, j.Wait = maxDeliver, 5*time.Second
		sum, err := j.Run(context.Background())
		if err != nil || sum != (Summary{Fetched: 1, Failed: 1}) {
			t.Fatalf("delivery %d: %+v, %v", delivery, sum, err)
		}
		if delivery > 1 {
			// Each run fetches as soon as the message is back: the gap is
			// the backoff of the previous delivery.
			if gap, want := time.Since(lastRun), handler.ErrorBackoff(base, uint64(delivery-1)); gap < want {
				t.Fatalf("delivery %d came back after %v, before its backoff %v", delivery, gap, want)
			}
		}
		lastRun = time.Now()
	}
	if queuedOnceSettled(t, env.Queue, a.ID, false) {
		t.Fatalf("assignment %s still queued after its last delivery: recover would never re-publish it", a.ID)
	}
}

// queuedOnceSettled reports whether assignment id is queued, once a
// settlement sent just before has reached the stream: a termination is sent
// without a reply, and the server applies it a moment later. It waits (at
// most 5 s) for the answer want, and returns the last answer.
func queuedOnceSettled(t *testing.T, q *assignmentqueue.Queue, id string, want bool) bool {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ids, _, err := q.Queued(context.Background(), taskassignment.BackendProcess, td)
		if err != nil {
			t.Fatal(err)
		}
		if ids[id] == want || time.Now().After(deadline) {
			return ids[id]
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A message still waiting for its executor on its last delivery is
// terminated too, not left in the stream where nothing delivers it again.
func TestJobTerminatesAWaitingMessageOnItsLastDelivery(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	c, err := env.JetStream.CreateOrUpdateConsumer(context.Background(), assignmentqueue.DefaultStream, jetstream.ConsumerConfig{
		Durable: string(taskassignment.BackendProcess), FilterSubject: assignmentqueue.Subject(taskassignment.BackendProcess),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxDeliver: 1, MaxAckPending: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	a := handlertest.Assignment(t, 10)
	publish(t, env.Queue, a)
	waiting := handlertest.AcceptFunc(func(context.Context, taskassignment.Assignment) (bool, error) { return false, nil })
	j := job(c, waiting, nil)
	setDelays(&j, time.Second, 0) // no hold: hand it back at once
	j.MaxDeliver, j.HoldFor = 1, time.Millisecond
	if sum, err := j.Run(context.Background()); err != nil || sum != (Summary{Fetched: 1, NotYet: 1}) {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
	if queuedOnceSettled(t, env.Queue, a.ID, false) {
		t.Fatalf("assignment %s still queued after its last delivery", a.ID)
	}
}
