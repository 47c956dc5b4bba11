package handler

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor/executortest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

func assignment(t testing.TB, taskID int64) taskassignment.Assignment {
	t.Helper()
	id, err := taskidentity.New(td, "alice/repo", "build", taskID)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendProcess, taskassignment.Task{ID: taskID, Pool: "linux"}, id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func worker(t testing.TB, backend executor.Backend) executor.Worker {
	t.Helper()
	b, err := bootstrap.New(bytes.Repeat([]byte{9}, 32), "https://gateway.example.org", spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := taskassignment.NewKeys("ci.example.org")
	if err != nil {
		t.Fatal(err)
	}
	return executor.Worker{Backend: backend, Bootstrap: b, Keys: keys}
}

// acceptFunc adapts a function to Acceptor.
type acceptFunc func(context.Context, taskassignment.Assignment) (bool, error)

func (f acceptFunc) Accept(ctx context.Context, a taskassignment.Assignment) (bool, error) {
	return f(ctx, a)
}

// encode returns a's message as dispatch publishes it: signed.
func encode(t testing.TB, a taskassignment.Assignment) []byte {
	t.Helper()
	return seal(t, jetstreamenv.Signer(), raw(t, a))
}

// raw returns a's message unsigned.
func raw(t testing.TB, a taskassignment.Assignment) []byte {
	t.Helper()
	data, err := taskassignment.Encode(a)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func seal(t testing.TB, s *assignmentsig.Signer, msg []byte) []byte {
	t.Helper()
	data, err := s.Seal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// never is an Acceptor that must not be reached: no backend call for a
// message that is not authentic or does not decode.
func never(context.Context, taskassignment.Assignment) (bool, error) { panic("must not be called") }

// tamper replaces old with replacement inside the signed message of sealed,
// keeping the signature: what a forger who copies a real message does.
func tamper(t *testing.T, sealed []byte, old, replacement string) []byte {
	t.Helper()
	var e map[string]any
	if err := json.Unmarshal(sealed, &e); err != nil {
		t.Fatal(err)
	}
	msg, err := base64.StdEncoding.DecodeString(e["msg"].(string))
	if err != nil || !bytes.Contains(msg, []byte(old)) {
		t.Fatalf("message %s lacks %q", msg, old)
	}
	e["msg"] = base64.StdEncoding.EncodeToString(bytes.Replace(msg, []byte(old), []byte(replacement), 1))
	out, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func withImage(a taskassignment.Assignment, image string) taskassignment.Assignment {
	a.Task.Image = image
	return a
}

// outcomes records what an Observer hears.
type outcomes struct {
	seen []struct {
		b taskassignment.BackendKind
		o Outcome
	}
}

func (r *outcomes) Handled(b taskassignment.BackendKind, o Outcome) {
	r.seen = append(r.seen, struct {
		b taskassignment.BackendKind
		o Outcome
	}{b, o})
}

func TestHandlerOutcomes(t *testing.T) {
	good := encode(t, assignment(t, 1))
	stranger, err := assignmentsig.NewSigner(secretkey.Key(bytes.Repeat([]byte{1}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		body   []byte
		accept acceptFunc
		want   Outcome
	}{
		{"accepted", good, func(context.Context, taskassignment.Assignment) (bool, error) { return true, nil }, Accepted},
		{"not yet", good, func(context.Context, taskassignment.Assignment) (bool, error) { return false, nil }, NotYet},
		{"failed", good, func(context.Context, taskassignment.Assignment) (bool, error) { return false, errors.New("api down") }, Failed},
		{"rejected", good, func(context.Context, taskassignment.Assignment) (bool, error) {
			return false, fmt.Errorf("create: %w", executor.Permanent(errors.New("invalid spec")))
		}, Rejected},
		{"poison", seal(t, jetstreamenv.Signer(), []byte("{")), never, Poison},
		{"poison from another trust domain", seal(t, jetstreamenv.Signer(), bytes.ReplaceAll(raw(t, assignment(t, 1)), []byte("ci.example.org"), []byte("evil.example.org"))), never, Poison},
		// Forged assignments: anything that reaches NATS could publish these.
		{"unsigned", raw(t, assignment(t, 1)), never, Poison},
		{"not even JSON", []byte("{"), never, Poison},
		{"signed with a wrong key", seal(t, stranger, raw(t, assignment(t, 1))), never, Poison},
		{"repository changed", tamper(t, good, "alice/repo", "mallory/repo"), never, Poison},
		{"image changed", tamper(t, encode(t, withImage(assignment(t, 1), "golang:1.26")), "golang:1.26", "evil/miner:1"), never, Poison},
		{"task changed", tamper(t, good, `"id":1,`, `"id":2,`), never, Poison},
		{"pool changed", tamper(t, good, `"pool":"linux"`, `"pool":"gpu"`), never, Poison},
		// A genuine message replayed after its expiry (kept from the queue, say).
		{"expired", seal(t, jetstreamenv.Signer().WithTTL(time.Hour).WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) }), raw(t, assignment(t, 1))), never, Poison},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &outcomes{}
			_, got, err := Handler{Worker: tc.accept, TrustDomain: td, Keys: jetstreamenv.Signer(), Observer: obs}.Handle(context.Background(), tc.body)
			if got != tc.want {
				t.Fatalf("Handle() = %v (%v), want %v", got, err, tc.want)
			}
			// The Observer hears every outcome once, with the backend of
			// what decoded (process) or none.
			if len(obs.seen) != 1 || obs.seen[0].o != got || (got != Poison && obs.seen[0].b != taskassignment.BackendProcess) {
				t.Fatalf("observed %+v, want one %v", obs.seen, got)
			}
			if (err != nil) != (tc.want == Failed || tc.want == Poison || tc.want == Rejected) {
				t.Fatalf("Handle() error = %v for outcome %v", err, got)
			}
		})
	}
	// Without keys nothing is accepted, and nothing is lost either.
	_, got, err := Handler{Worker: acceptFunc(never), TrustDomain: td}.Handle(context.Background(), good)
	if got != Failed || err == nil {
		t.Fatalf("Handle() without keys = %v (%v), want failed", got, err)
	}
}

// queue starts a server with the stream and the process backend's consumer.
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

func job(c jetstream.Consumer, a Acceptor, log *logBuffer) Job {
	h := Handler{Worker: a, TrustDomain: td, Keys: jetstreamenv.Signer()}
	if log != nil {
		h.Log = slog.New(slog.NewTextHandler(log, nil))
	}
	return Job{Handler: h, Consumer: c, Batch: 1, Wait: 500 * time.Millisecond, NakDelay: 300 * time.Millisecond, ErrorDelay: 300 * time.Millisecond}
}

func TestJobAcceptsAndAcks(t *testing.T) {
	q, c, _ := queue(t, 4)
	backend := executortest.NewMemory("node-1")
	a := assignment(t, 7)
	publish(t, q, a)
	sum, err := job(c, worker(t, backend), nil).Run(context.Background())
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
		a := assignment(t, 100+i)
		publish(t, q, a)
		if sum, err := job(c, worker(t, backend), nil).Run(context.Background()); err != nil || sum.Accepted != 1 {
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
	sum, err := job(c, worker(t, executortest.NewMemory("n")), nil).Run(context.Background())
	if err != nil || sum != (Summary{}) {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
}

func TestJobTakesAtMostBatch(t *testing.T) {
	q, c, _ := queue(t, 10)
	for i := range 5 {
		publish(t, q, assignment(t, int64(i+1)))
	}
	j := job(c, worker(t, executortest.NewMemory("n")), nil)
	j.Batch = 3
	sum, err := j.Run(context.Background())
	if err != nil || sum.Fetched != 3 || sum.Accepted != 3 {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
	expectOutstanding(t, q, 2)
}

func TestJobPoisonIsTerminatedOnce(t *testing.T) {
	q, c, js := queue(t, 4)
	if _, err := js.Publish(context.Background(), assignmentqueue.Subject(taskassignment.BackendProcess), seal(t, jetstreamenv.Signer(), []byte(`{"version":9}`))); err != nil {
		t.Fatal(err)
	}
	var log logBuffer
	calls := 0
	accept := acceptFunc(func(context.Context, taskassignment.Assignment) (bool, error) { calls++; return true, nil })
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
	good := encode(t, withImage(assignment(t, 5), "golang:1.26"))
	forged := [][]byte{
		raw(t, assignment(t, 5)),                       // unsigned
		seal(t, stranger, raw(t, assignment(t, 5))),    // signed with a wrong key
		tamper(t, good, "alice/repo", "mallory/repo"),  // a valid one, repository changed
		tamper(t, good, "golang:1.26", "evil/miner:1"), // a valid one, image changed
	}
	for _, data := range forged {
		if _, err := js.Publish(context.Background(), assignmentqueue.Subject(taskassignment.BackendProcess), data); err != nil {
			t.Fatal(err)
		}
	}
	backend := executortest.NewMemory("node-1")
	var log logBuffer
	j := job(c, worker(t, backend), &log)
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
	if sum, err := job(c, worker(t, backend), nil).Run(context.Background()); err != nil || sum.Fetched != 0 {
		t.Fatalf("a forged message came back: %+v, %v", sum, err)
	}
	expectOutstanding(t, q, 0)
}

func TestJobRedeliversNotYetAndFailed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first func() (bool, error)
		want  Outcome
	}{
		{"identity target pending", func() (bool, error) { return false, nil }, NotYet},
		{"backend error", func() (bool, error) { return false, errors.New("backend unavailable") }, Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, c, _ := queue(t, 4)
			a := assignment(t, 3)
			publish(t, q, a)
			var (
				mu         sync.Mutex
				deliveries int
			)
			accept := acceptFunc(func(context.Context, taskassignment.Assignment) (bool, error) {
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
			j.NakDelay, j.ErrorDelay, j.HoldFor = 2*time.Second, 2*time.Second, time.Second
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
	publish(t, q, assignment(t, 5))
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	blocked := acceptFunc(func(ctx context.Context, _ taskassignment.Assignment) (bool, error) {
		close(started)
		<-ctx.Done()
		return false, ctx.Err()
	})
	j := job(c, blocked, nil)
	j.ErrorDelay = time.Hour // a shutdown must not use the error backoff
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
func runInBackground(ctx context.Context, j Job) <-chan runResult {
	done := make(chan runResult, 1)
	go func() {
		sum, err := j.Run(ctx)
		done <- runResult{sum, err}
	}()
	return done
}

// takeBack runs a Job that accepts whatever it fetches from c within wait,
// and returns its summary and the delivery count of the message it fetched.
func takeBack(c jetstream.Consumer, wait time.Duration) (Summary, uint64, error) {
	var delivered uint64
	next := job(c, acceptFunc(func(context.Context, taskassignment.Assignment) (bool, error) { return true, nil }), nil)
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

func TestReceiverStatusCodes(t *testing.T) {
	good := encode(t, assignment(t, 11))
	for _, tc := range []struct {
		name      string
		eventType string
		data      []byte
		accept    acceptFunc
		want      int
	}{
		{"accepted", taskassignment.EventType, good, func(context.Context, taskassignment.Assignment) (bool, error) { return true, nil }, http.StatusAccepted},
		{"not yet", taskassignment.EventType, good, func(context.Context, taskassignment.Assignment) (bool, error) { return false, nil }, http.StatusServiceUnavailable},
		{"failed", taskassignment.EventType, good, func(context.Context, taskassignment.Assignment) (bool, error) { return false, errors.New("down") }, http.StatusInternalServerError},
		{"rejected", taskassignment.EventType, good, func(context.Context, taskassignment.Assignment) (bool, error) {
			return false, executor.Permanent(errors.New("invalid spec"))
		}, http.StatusOK}, // with a reply: TestReceiverRepliesToARejection
		{"poison", taskassignment.EventType, seal(t, jetstreamenv.Signer(), []byte(`{"version":1}`)), nil, http.StatusBadRequest},
		{"unsigned", taskassignment.EventType, raw(t, assignment(t, 11)), nil, http.StatusBadRequest},
		{"another type", "dev.example.other", good, nil, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := Receiver{Handler: Handler{Worker: tc.accept, TrustDomain: td, Keys: jetstreamenv.Signer()}}.NewHTTPHandler(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			client, err := cloudevents.NewClientHTTP()
			if err != nil {
				t.Fatal(err)
			}
			e := cloudevents.NewEvent()
			e.SetID("linux-11")
			e.SetSource("dispatch/linux")
			e.SetType(tc.eventType)
			if err := e.SetData(cloudevents.ApplicationJSON, tc.data); err != nil {
				t.Fatal(err)
			}
			res := client.Send(cloudevents.ContextWithTarget(context.Background(), srv.URL), e)
			var httpRes *cehttp.Result
			if !cloudevents.ResultAs(res, &httpRes) {
				t.Fatalf("no HTTP result: %v", res)
			}
			if httpRes.StatusCode != tc.want {
				t.Fatalf("status = %d (%v), want %d", httpRes.StatusCode, res, tc.want)
			}
		})
	}
}

func TestReceiverAcceptsEndToEnd(t *testing.T) {
	backend := executortest.NewMemory("node-1")
	h, err := Receiver{Handler: Handler{Worker: worker(t, backend), TrustDomain: td, Keys: jetstreamenv.Signer()}}.NewHTTPHandler(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a := assignment(t, 12)
	for i := range 2 {
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(encode(t, a)))
		for k, v := range map[string]string{
			"Content-Type": "application/json", "Ce-Specversion": "1.0", "Ce-Id": a.ID,
			"Ce-Source": "dispatch/linux", "Ce-Type": taskassignment.EventType,
		} {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusAccepted {
			t.Fatalf("delivery %d: status %d: %s", i+1, rec.Code, rec.Body)
		}
	}
	if backend.Creates() != 1 {
		t.Fatalf("%d creates for one assignment delivered twice", backend.Creates())
	}
}

// TestReceiverRepliesToARejection: an assignment the backend can never
// accept is acknowledged with a reply event that carries the signed
// assignment as it came and the reason, for the Subscription's reply to
// take to recover; nothing else answers with an event.
func TestReceiverRepliesToARejection(t *testing.T) {
	good := encode(t, assignment(t, 13))
	for _, tc := range []struct {
		name   string
		accept acceptFunc
		reply  bool
	}{
		{"rejected", func(context.Context, taskassignment.Assignment) (bool, error) {
			return false, executor.Permanent(errors.New("pool linux has no profile\nPod spec invalid"))
		}, true},
		{"accepted", func(context.Context, taskassignment.Assignment) (bool, error) { return true, nil }, false},
		{"failed", func(context.Context, taskassignment.Assignment) (bool, error) { return false, errors.New("down") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := Receiver{Handler: Handler{Worker: tc.accept, TrustDomain: td, Keys: jetstreamenv.Signer()}}.NewHTTPHandler(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			client, err := cloudevents.NewClientHTTP()
			if err != nil {
				t.Fatal(err)
			}
			e := cloudevents.NewEvent()
			e.SetID("linux-13")
			e.SetSource("dispatch/linux")
			e.SetType(taskassignment.EventType)
			if err := e.SetData(cloudevents.ApplicationJSON, good); err != nil {
				t.Fatal(err)
			}
			resp, res := client.Request(cloudevents.ContextWithTarget(context.Background(), srv.URL), e)
			if !tc.reply {
				if resp != nil {
					t.Fatalf("reply %v to an assignment that was not rejected", resp)
				}
				return
			}
			if !cloudevents.IsACK(res) || resp == nil {
				t.Fatalf("no acknowledged reply: %v, %v", resp, res)
			}
			if resp.Type() != taskassignment.RejectionType {
				t.Errorf("reply type %q, want %q", resp.Type(), taskassignment.RejectionType)
			}
			if !bytes.Equal(resp.Data(), good) {
				t.Errorf("reply data is not the signed assignment as it came")
			}
			if got := fmt.Sprint(resp.Extensions()[taskassignment.ReasonExtension]); !strings.Contains(got, "pool linux has no profile") {
				t.Errorf("reply reason %q does not say why", got)
			}
		})
	}
}

func ExampleOutcome() {
	for _, o := range []Outcome{Accepted, NotYet, Failed, Poison, Rejected} {
		fmt.Println(o)
	}
	// Output:
	// accepted
	// not_yet
	// failed
	// poison
	// rejected
}
