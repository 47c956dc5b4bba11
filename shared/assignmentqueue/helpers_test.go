package assignmentqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

const testPool = "pool-a"

// testTD is the trust domain of every test assignment.
func testTD() spiffeid.TrustDomain { return spiffeid.RequireTrustDomainFromString("ci.example.org") }

// testContext is a context that ends with the test, bounded so a hung server
// fails the test instead of the suite.
func testContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newJetStream starts a server of the test's own and connects to it.
func newJetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	_, url := jetstreamenv.Start(t)
	_, js := jetstreamenv.Connect(t, url)
	return js
}

// newQueue returns a queue on a fresh server with its stream ensured.
func newQueue(t testing.TB) (context.Context, jetstream.JetStream, *assignmentqueue.Queue) {
	t.Helper()
	env := jetstreamenv.NewQueue(t)
	return testContext(t), env.JetStream, env.Queue
}

// decode authenticates and decodes a message as handle does.
func decode(data []byte) (taskassignment.Assignment, error) {
	msg, err := jetstreamenv.Signer().Open(data)
	if err != nil {
		return taskassignment.Assignment{}, err
	}
	return taskassignment.Decode(msg, testTD())
}

// assignment returns a valid assignment of task taskID to backend b.
func assignment(t testing.TB, b taskassignment.BackendKind, taskID int64) taskassignment.Assignment {
	t.Helper()
	id, err := taskidentity.New(testTD(), "Owner/Repo", "build", taskID)
	if err != nil {
		t.Fatalf("identity: %v", err)
	}
	a, err := taskassignment.New(b, taskassignment.Task{ID: taskID, Pool: testPool}, id)
	if err != nil {
		t.Fatalf("assignment: %v", err)
	}
	return a
}

// publish publishes a and fails the test if the stream did not store it.
func publish(t testing.TB, ctx context.Context, q *assignmentqueue.Queue, a taskassignment.Assignment) {
	t.Helper()
	ack, err := q.Publish(ctx, a)
	if err != nil {
		t.Fatalf("Publish %s: %v", a.ID, err)
	}
	if ack.Duplicate {
		t.Fatalf("Publish %s: stored nothing (duplicate)", a.ID)
	}
}

// eventually polls cond every 10ms until it holds or 5s have passed.
func eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not true after 5s: %s", what, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// streamMsgs returns the number of messages in the queue's stream.
func streamMsgs(t testing.TB, ctx context.Context, js jetstream.JetStream, q *assignmentqueue.Queue) uint64 {
	t.Helper()
	s, err := js.Stream(ctx, q.Stream())
	if err != nil {
		t.Fatalf("stream %s: %v", q.Stream(), err)
	}
	return s.CachedInfo().State.Msgs
}
