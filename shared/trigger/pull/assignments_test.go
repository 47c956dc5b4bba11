package pull

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor/executortest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

func queue(t *testing.T, capacity int) (*assignmentqueue.Queue, jetstream.Consumer, jetstream.JetStream) {
	t.Helper()
	q := jetstreamenv.NewQueue(t)
	return q.Queue, q.OpenConsumer(t, taskassignment.BackendProcess, capacity), q.JetStream
}

func publish(t *testing.T, q *assignmentqueue.Queue, a taskassignment.Assignment) {
	t.Helper()
	if _, err := q.Publish(context.Background(), a); err != nil {
		t.Fatal(err)
	}
}

// expectOutstanding waits until the backend's consumer has want messages
// pending or unacknowledged: acks are asynchronous and the server updates its
// counts a moment after.
func expectOutstanding(t *testing.T, q *assignmentqueue.Queue, want int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		n, err := q.Outstanding(context.Background(), taskassignment.BackendProcess)
		if err != nil {
			t.Fatal(err)
		}
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages outstanding, want %d", n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func job(c jetstream.Consumer, a handler.Acceptor, log *logBuffer) Assignments {
	h := handler.Handler{Worker: a, TrustDomain: td, Keys: jetstreamenv.Signer(), NotYetDelay: 300 * time.Millisecond, ErrorDelay: 300 * time.Millisecond}
	j := Assignments{Decider: h, Consumer: c, Batch: 1, Wait: 500 * time.Millisecond}
	if log != nil {
		j.Log = slog.New(slog.NewTextHandler(log, nil))
	}
	return j
}

var td = handlertest.TrustDomain

// setDelays sets the delays of j's handler.Handler; zero keeps one.
func setDelays(j *Assignments, notYet, failed time.Duration) {
	h := j.Decider.(handler.Handler)
	if notYet != 0 {
		h.NotYetDelay = notYet
	}
	if failed != 0 {
		h.ErrorDelay = failed
	}
	j.Decider = h
}

func TestJobAcceptsAndAcks(t *testing.T) {
	q, c, _ := queue(t, 4)
	backend := executortest.NewMemory("node-1")
	a := handlertest.Assignment(t, 7)
	publish(t, q, a)
	sum, err := job(c, handlertest.Worker(t, backend), nil).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum != (Summary{Fetched: 1, Accepted: 1}) {
		t.Fatalf("summary = %+v", sum)
	}
	if e, _ := backend.Find(context.Background(), a.ID); e == nil {
		t.Fatal("no executor after an accepted message")
	}
	expectOutstanding(t, q, 0)
}

// An accepted message is acknowledged before Run returns, not merely sent:
// right after the run (no flush, no wait) the stream no longer holds it. A
// plain ack is still in flight then; a run killed at that moment would have
// logged "accepted" for a message that comes back.
func TestJobAckIsConfirmed(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	q := env.Queue
	env.OpenConsumer(t, taskassignment.BackendProcess, 4)
	// handle's own connection: what it sends is not ordered with the test's reads.
	_, js := jetstreamenv.Connect(t, env.URL)
	c, err := assignmentqueue.New(js, "").Consumer(context.Background(), taskassignment.BackendProcess)
	if err != nil {
		t.Fatal(err)
	}
	backend := executortest.NewMemory("node-1")
	for i := range int64(20) {
		a := handlertest.Assignment(t, 100+i)
		publish(t, q, a)
		if sum, err := job(c, handlertest.Worker(t, backend), nil).Run(context.Background()); err != nil || sum.Accepted != 1 {
			t.Fatalf("Run = %+v, %v", sum, err)
		}
		queued, _, err := q.Queued(context.Background(), taskassignment.BackendProcess, td)
		if err != nil {
			t.Fatal(err)
		}
		if queued[a.ID] {
			t.Fatalf("assignment %s still in the stream when Run returned it accepted", a.ID)
		}
	}
}

func TestJobWithoutMessagesIsAnEmptyRun(t *testing.T) {
	_, c, _ := queue(t, 4)
	sum, err := job(c, handlertest.Worker(t, executortest.NewMemory("n")), nil).Run(context.Background())
	if err != nil || sum != (Summary{}) {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
}

func TestJobTakesAtMostBatch(t *testing.T) {
	q, c, _ := queue(t, 10)
	for i := range 5 {
		publish(t, q, handlertest.Assignment(t, int64(i+1)))
	}
	j := job(c, handlertest.Worker(t, executortest.NewMemory("n")), nil)
	j.Batch = 3
	sum, err := j.Run(context.Background())
	if err != nil || sum.Fetched != 3 || sum.Accepted != 3 {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
	expectOutstanding(t, q, 2)
}

func TestJobPoisonIsTerminatedOnce(t *testing.T) {
	q, c, js := queue(t, 4)
	if _, err := js.Publish(context.Background(), assignmentqueue.Subject(taskassignment.BackendProcess), handlertest.Seal(t, jetstreamenv.Signer(), []byte(`{"version":9}`))); err != nil {
		t.Fatal(err)
	}
	var log logBuffer
	calls := 0
	accept := handlertest.AcceptFunc(func(context.Context, taskassignment.Assignment) (bool, error) { calls++; return true, nil })
	sum, err := job(c, accept, &log).Run(context.Background())
	if err != nil || sum != (Summary{Fetched: 1, Poison: 1}) || calls != 0 {
		t.Fatalf("Run() = %+v, %v (accept called %d times)", sum, err, calls)
	}
	lines := strings.Count(log.String(), "\n")
	if lines != 1 || !strings.Contains(log.String(), "stream_seq=1") || !strings.Contains(log.String(), "unsupported version 9") {
		t.Fatalf("want one log line naming the stream sequence and the fault, got %d:\n%s", lines, log.String())
	}
	// Terminated: not delivered again, even after the nak and ack delays.
	time.Sleep(400 * time.Millisecond)
	sum, err = job(c, accept, nil).Run(context.Background())
	if err != nil || sum.Fetched != 0 {
		t.Fatalf("poison delivered again: %+v, %v", sum, err)
	}
	expectOutstanding(t, q, 0)
}

// Forged assignments published straight to the stream, as a job's own code
// that reaches NATS could, are terminated on their first delivery with one
// log line each naming the stream sequence, and no backend call.
func TestJobTerminatesForgedAssignments(t *testing.T) {
	q, c, js := queue(t, 8)
	stranger, err := assignmentsig.NewSigner(secretkey.Key(bytes.Repeat([]byte{1}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	good := handlertest.Encode(t, handlertest.WithImage(handlertest.Assignment(t, 5), "golang:1.26"))
	forged := [][]byte{
		handlertest.Raw(t, handlertest.Assignment(t, 5)),                                // unsigned
		handlertest.Seal(t, stranger, handlertest.Raw(t, handlertest.Assignment(t, 5))), // signed with a wrong key
		handlertest.Tamper(t, good, "alice/repo", "mallory/repo"),                       // a valid one, repository changed
		handlertest.Tamper(t, good, "golang:1.26", "evil/miner:1"),                      // a valid one, image changed
	}
	for _, data := range forged {
		if _, err := js.Publish(context.Background(), assignmentqueue.Subject(taskassignment.BackendProcess), data); err != nil {
			t.Fatal(err)
		}
	}
	backend := executortest.NewMemory("node-1")
	var log logBuffer
	j := job(c, handlertest.Worker(t, backend), &log)
	j.Batch = len(forged)
	sum, err := j.Run(context.Background())
	if err != nil || sum != (Summary{Fetched: len(forged), Poison: len(forged)}) || backend.Creates() != 0 {
		t.Fatalf("Run() = %+v, %v; %d executors created", sum, err, backend.Creates())
	}
	out := log.String()
	if n := strings.Count(out, "unauthenticated assignment terminated"); n != len(forged) || strings.Count(out, "\n") != len(forged) {
		t.Fatalf("want one line per forged message, got:\n%s", out)
	}
	for seq := 1; seq <= len(forged); seq++ {
		if !strings.Contains(out, fmt.Sprintf("stream_seq=%d ", seq)) {
			t.Errorf("no line names stream sequence %d:\n%s", seq, out)
		}
	}
	if strings.Contains(out, "mallory") || strings.Contains(out, "miner") {
		t.Errorf("the log quotes a forged message:\n%s", out)
	}
	time.Sleep(400 * time.Millisecond)
	if sum, err := job(c, handlertest.Worker(t, backend), nil).Run(context.Background()); err != nil || sum.Fetched != 0 {
		t.Fatalf("a forged message came back: %+v, %v", sum, err)
	}
	expectOutstanding(t, q, 0)
}

func TestJobRedeliversNotYetAndFailed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first func() (bool, error)
		want  handler.Outcome
	}{
		{"identity target pending", func() (bool, error) { return false, nil }, handler.NotYet},
		{"backend error", func() (bool, error) { return false, errors.New("backend unavailable") }, handler.Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, c, _ := queue(t, 4)
			a := handlertest.Assignment(t, 3)
			publish(t, q, a)
			var (
				mu         sync.Mutex
				deliveries int
			)
			accept := handlertest.AcceptFunc(func(context.Context, taskassignment.Assignment) (bool, error) {
				mu.Lock()
				defer mu.Unlock()
				deliveries++
				if deliveries == 1 {
					return tc.first()
				}
				return true, nil
			})
			j := job(c, accept, nil)
			// Delays long enough that a loaded machine cannot blur "not yet";
			// a hold shorter than the nak delay never holds: the run hands
			// the message back (TestJobHolds covers holding).
			setDelays(&j, 2*time.Second, 2*time.Second)
			j.HoldFor = time.Second
			sum, err := j.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var want Summary
			want.Fetched = 1
			want.count(tc.want)
			if sum != want {
				t.Fatalf("first run = %+v, want %+v", sum, want)
			}
			// Not before the delay...
			j.Wait = 300 * time.Millisecond
			if sum, _ := j.Run(context.Background()); sum.Fetched != 0 {
				t.Fatalf("redelivered before the nak delay: %+v", sum)
			}
			// ...but after it.
			j.Wait = 5 * time.Second
			if sum, err := j.Run(context.Background()); err != nil || sum.Accepted != 1 {
				t.Fatalf("second run = %+v, %v", sum, err)
			}
			expectOutstanding(t, q, 0)
		})
	}
}

// On SIGTERM (a cancelled context) the message in flight goes back at once.
func TestJobShutdownHandsBackInFlight(t *testing.T) {
	q, c, _ := queue(t, 4)
	publish(t, q, handlertest.Assignment(t, 5))
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	blocked := handlertest.AcceptFunc(func(ctx context.Context, _ taskassignment.Assignment) (bool, error) {
		close(started)
		<-ctx.Done()
		return false, ctx.Err()
	})
	j := job(c, blocked, nil)
	setDelays(&j, 0, time.Hour) // a shutdown must not use the error backoff
	done := runInBackground(ctx, j)
	<-started
	cancel()
	if r := <-done; r.sum.Failed != 1 {
		t.Fatalf("summary = %+v", r.sum)
	}
	if sum, delivered, err := takeBack(c, time.Second); err != nil || sum.Accepted != 1 || delivered != 2 {
		t.Fatalf("the handed-back message did not come back at once: %+v, %v, delivery %d", sum, err, delivered)
	}
}

// runResult is what one Job.Run returned.
type runResult struct {
	sum Summary
	err error
}

// runInBackground starts j.Run(ctx) and delivers its result.
func runInBackground(ctx context.Context, j Assignments) <-chan runResult {
	done := make(chan runResult, 1)
	go func() {
		sum, err := j.Run(ctx)
		done <- runResult{sum, err}
	}()
	return done
}

// takeBack runs a Assignments that accepts whatever it fetches from c within wait,
// and returns its summary and the delivery count of the message it fetched.
func takeBack(c jetstream.Consumer, wait time.Duration) (Summary, uint64, error) {
	var delivered uint64
	next := job(c, handlertest.AcceptFunc(func(context.Context, taskassignment.Assignment) (bool, error) { return true, nil }), nil)
	next.Consumer = metadataPeek{c, &delivered}
	next.Wait = wait
	sum, err := next.Run(context.Background())
	return sum, delivered, err
}

// metadataPeek records the delivery count of the messages it fetches.
type metadataPeek struct {
	jetstream.Consumer
	delivered *uint64
}

func (m metadataPeek) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := m.Consumer.Fetch(n, opts...)
	if err != nil {
		return nil, err
	}
	return peekBatch{b, m.delivered}, nil
}

type peekBatch struct {
	jetstream.MessageBatch
	delivered *uint64
}

func (p peekBatch) Messages() <-chan jetstream.Msg {
	out := make(chan jetstream.Msg)
	go func() {
		defer close(out)
		for msg := range p.MessageBatch.Messages() {
			if md, err := msg.Metadata(); err == nil {
				*p.delivered = md.NumDelivered
			}
			out <- msg
		}
	}()
	return out
}
