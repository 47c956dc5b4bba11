package recoverer

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/pull"
)

// reportingGitea is giteaView that keeps the reasons reported, and answers
// failures (a Gitea 5xx) to the first failReports reports.
type reportingGitea struct {
	*giteaView
	mu          sync.Mutex
	failReports int
	reports     int
	reasons     map[int64]string
}

func (g *reportingGitea) Report(ctx context.Context, id int64, e executor.Executor) error {
	g.mu.Lock()
	g.reports++
	if g.failReports > 0 {
		g.failReports--
		g.mu.Unlock()
		return errors.New("task 1: final result: unavailable: 503 Service Unavailable")
	}
	g.reasons[id] = e.Reason
	g.mu.Unlock()
	return g.giteaView.Report(ctx, id, e)
}

// refusing is the memory backend whose Create, or BindIdentity, fails with
// err (marked permanent or not by the test).
type refusing struct {
	executor.Backend
	create, bind error
}

func (b refusing) Create(ctx context.Context, a taskassignment.Assignment, spec executor.LaunchSpec) (*executor.Executor, error) {
	if b.create != nil {
		return nil, b.create
	}
	return b.Backend.Create(ctx, a, spec)
}

func (b refusing) BindIdentity(ctx context.Context, e *executor.Executor, id taskidentity.Identity) error {
	if b.bind != nil {
		return b.bind
	}
	return b.Backend.BindIdentity(ctx, e, id)
}

// withRejections is the fixture with the rejection stream wired in and
// Gitea keeping reasons.
func withRejections(t *testing.T) (fixture, *reportingGitea) {
	t.Helper()
	f := setup(t)
	f.r.Rejections = f.queue
	g := &reportingGitea{giteaView: f.gitea, reasons: map[int64]string{}}
	p := f.r.Pools["linux"]
	p.Tasks = g
	f.r.Pools["linux"] = p
	return f, g
}

// handleOnce runs one run of handle's adapter (pull.Assignments), as handle does, with backend b and a
// consumer of the process backend limited to maxDeliver deliveries.
func (f fixture) handleOnce(t *testing.T, b executor.Backend, maxDeliver int) pull.Summary {
	t.Helper()
	c := f.consumer(t, maxDeliver, time.Minute)
	w := executor.Worker{Backend: b, Bootstrap: f.boot, Keys: f.r.Keys}
	j := pull.Assignments{Decider: handler.Handler{Worker: w, TrustDomain: td, Keys: jetstreamenv.Signer(), ErrorDelay: time.Hour},
		Consumer: c, Batch: 1, Wait: time.Second, HoldFor: time.Millisecond, MaxDeliver: maxDeliver}
	sum, err := j.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// consumer brings the process backend's consumer to maxDeliver and ackWait.
func (f fixture) consumer(t *testing.T, maxDeliver int, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	c, err := f.js.CreateOrUpdateConsumer(context.Background(), f.queue.Stream(), jetstream.ConsumerConfig{
		Durable: string(taskassignment.BackendProcess), FilterSubject: assignmentqueue.Subject(taskassignment.BackendProcess),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: maxDeliver, MaxAckPending: 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// captured waits up to 5 s for n entries of the rejection stream.
func (f fixture) captured(t *testing.T, n int) []taskassignment.Rejection {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := f.queue.Rejections(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rejections captured, want %d", len(got), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f fixture) publish(t *testing.T, a taskassignment.Assignment) {
	t.Helper()
	if _, err := f.queue.Publish(context.Background(), a); err != nil {
		t.Fatal(err)
	}
}

// TestRejectedTaskIsFailedWithItsReason: an assignment the backend refuses
// for good is terminated by handle, captured, and failed by recover's next
// Run with the backend's reason; executor, payload and entry are gone, and
// nothing is re-published.
func TestRejectedTaskIsFailedWithItsReason(t *testing.T) {
	invalid := executor.Permanent(errors.New(`Pod "gdr-linux-1" is invalid: spec.containers[0].image: Required value`))
	for _, tc := range []struct {
		name         string
		create, bind error
	}{
		{"create refused: no executor", invalid, nil},
		{"bind refused: the executor exists", nil, invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, g := withRejections(t)
			ctx := context.Background()
			a := f.claimed(t, 1, false)
			f.publish(t, a)
			if sum := f.handleOnce(t, refusing{Backend: f.backend, create: tc.create, bind: tc.bind}, taskassignment.MaxDeliver); sum.Rejected != 1 {
				t.Fatalf("handle: %+v, want the assignment rejected", sum)
			}
			f.captured(t, 1)
			if q, _, _ := f.queue.Queued(ctx, taskassignment.BackendProcess, td); q[a.ID] {
				t.Fatal("the rejected message is still queued")
			}

			sum, err := f.r.Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if sum != (Summary{Rejected: 1}) {
				t.Fatalf("Run = %+v, want one task failed and nothing else (no executor handled, nothing re-published)", sum)
			}
			if g.reported[1] != executor.PhaseFailed || !strings.Contains(g.reasons[1], `Pod "gdr-linux-1" is invalid: spec.containers[0].image: Required value`) {
				t.Fatalf("reported %q with reason %q", g.reported[1], g.reasons[1])
			}
			if e, _ := f.backend.Find(ctx, a.ID); e != nil {
				t.Fatalf("executor left: %+v", e)
			}
			if f.hasPayload(t, a.ID) {
				t.Fatal("payload left: the pool's slot is not freed")
			}
			if ended, err := f.endings.Ended(ctx, a.ID); err != nil || !ended {
				t.Fatalf("task not marked ended (%v): a redelivery could create its executor again", err)
			}
			if left, err := f.queue.Rejections(ctx, 0); err != nil || len(left) != 0 {
				t.Fatalf("rejections left: %+v, %v", left, err)
			}
			// Idempotent: the next Run finds nothing to do.
			if again, err := f.r.Run(ctx); err != nil || again != (Summary{}) {
				t.Fatalf("second Run = %+v, %v", again, err)
			}
		})
	}
}

// TestRejectionKeptWhileGiteaFails: a report that fails (Gitea 5xx) leaves
// the entry, and the payload (no orphan re-published meanwhile), for the
// next Run, which fails the task.
func TestRejectionKeptWhileGiteaFails(t *testing.T) {
	f, g := withRejections(t)
	g.failReports = 2
	ctx := context.Background()
	a := f.claimed(t, 1, false)
	f.publish(t, a)
	f.handleOnce(t, refusing{Backend: f.backend, create: executor.Permanent(errors.New("no such pool"))}, taskassignment.MaxDeliver)
	f.captured(t, 1)
	for run := 1; run <= 2; run++ {
		sum, err := f.r.Run(ctx)
		if err != nil || sum != (Summary{RejectionsLeft: 1}) {
			t.Fatalf("run %d while Gitea fails: %+v, %v", run, sum, err)
		}
		if !f.hasPayload(t, a.ID) || len(f.captured(t, 1)) != 1 || g.reported[1] != "" {
			t.Fatalf("run %d: the entry or payload is gone, or the task was reported", run)
		}
		if q, _, _ := f.queue.Queued(ctx, taskassignment.BackendProcess, td); q[a.ID] {
			t.Fatalf("run %d re-published the payload of a pending rejection", run)
		}
	}
	sum, err := f.r.Run(ctx)
	if err != nil || sum != (Summary{Rejected: 1}) {
		t.Fatalf("run once Gitea answers: %+v, %v", sum, err)
	}
	if g.reported[1] != executor.PhaseFailed || !strings.Contains(g.reasons[1], "no such pool") || f.hasPayload(t, a.ID) {
		t.Fatalf("reported %q (%q), payload %v", g.reported[1], g.reasons[1], f.hasPayload(t, a.ID))
	}
	if g.reports != 3 {
		t.Fatalf("%d reports, want 3", g.reports)
	}
}

// TestExhaustedDeliveriesFailTheTask: a message handed back on its last
// delivery (terminated by handle), and one whose last delivery nobody
// settled (a handle killed: the server's MAX_DELIVERIES advisory), both end
// with the task failed, its payload deleted and no message left in the
// queue.
func TestExhaustedDeliveriesFailTheTask(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle func(t *testing.T, f fixture)
	}{
		{"terminated on the last delivery", func(t *testing.T, f fixture) {
			transient := refusing{Backend: f.backend, create: errors.New("apiserver: 503")}
			if sum := f.handleOnce(t, transient, 1); sum.Failed != 1 {
				t.Fatalf("handle: %+v", sum)
			}
		}},
		{"last delivery never settled", func(t *testing.T, f fixture) {
			c := f.consumer(t, 1, 100*time.Millisecond)
			if _, err := c.Next(); err != nil { // taken, then the handle dies
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, g := withRejections(t)
			ctx := context.Background()
			a := f.claimed(t, 1, false)
			f.publish(t, a)
			tc.settle(t, f)
			f.captured(t, 1)

			sum, err := f.r.Run(ctx)
			if err != nil || sum != (Summary{Exhausted: 1}) {
				t.Fatalf("Run = %+v, %v", sum, err)
			}
			if g.reported[1] != executor.PhaseFailed || !strings.Contains(g.reasons[1], "ran out of deliveries (1)") {
				t.Fatalf("reported %q with reason %q", g.reported[1], g.reasons[1])
			}
			if f.hasPayload(t, a.ID) {
				t.Fatal("payload left")
			}
			s, err := f.js.Stream(ctx, f.queue.Stream())
			if err != nil || s.CachedInfo().State.Msgs != 0 {
				t.Fatalf("queue stream holds messages: %+v, %v", s.CachedInfo().State, err)
			}
			if again, err := f.r.Run(ctx); err != nil || again != (Summary{}) {
				t.Fatalf("second Run = %+v, %v", again, err)
			}
		})
	}
}

// An assignment that ran out of deliveries while its executor exists (its
// ack lost on the last delivery, a handle killed after Create) is the
// backend's: its task is not failed, the entry and the message go, and the
// pass keeps handling the executor.
func TestExhaustedWithAnExecutorIsNotFailed(t *testing.T) {
	f, g := withRejections(t)
	ctx := context.Background()
	a := f.claimed(t, 1, true) // the executor exists
	f.publish(t, a)
	c := f.consumer(t, 1, 100*time.Millisecond)
	if _, err := c.Next(); err != nil { // taken on its last delivery, never settled
		t.Fatal(err)
	}
	f.captured(t, 1)

	sum, err := f.r.Run(ctx)
	if err != nil || sum.Exhausted != 0 || sum.RejectionsDropped != 1 || sum.RejectionsLeft != 0 || sum.Executors != 1 {
		t.Fatalf("Run = %+v, %v", sum, err)
	}
	if _, reported := g.reported[1]; reported {
		t.Fatalf("a running task was reported %q (%q)", g.reported[1], g.reasons[1])
	}
	if e, _ := f.backend.Find(ctx, a.ID); e == nil {
		t.Fatal("the executor was deleted")
	}
	if !f.hasPayload(t, a.ID) {
		t.Fatal("the payload of a running task was deleted")
	}
	if left, err := f.queue.Rejections(ctx, 0); err != nil || len(left) != 0 {
		t.Fatalf("rejections left: %+v, %v", left, err)
	}
	s, err := f.js.Stream(ctx, f.queue.Stream())
	if err != nil || s.CachedInfo().State.Msgs != 0 {
		t.Fatalf("the message past its last delivery is still queued: %+v, %v", s.CachedInfo().State, err)
	}
}

// TestDrainEntriesThatNameNoTask: entries recover cannot act on are removed
// (and their payloads left to the orphan pass), except those of a pool not
// configured here, which are left alone.
func TestDrainEntriesThatNameNoTask(t *testing.T) {
	const (
		terminated = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.CI_RUNNER."
		maxDeliver = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.CI_RUNNER."
	)
	termination := func(consumer, reason string) (string, any) {
		return terminated + consumer, server.JSConsumerDeliveryTerminatedAdvisory{
			TypedEvent: server.TypedEvent{Type: server.JSConsumerDeliveryTerminatedAdvisoryType},
			Stream:     "CI_RUNNER", Consumer: consumer, StreamSeq: 1, Deliveries: 1, Reason: reason}
	}
	for _, tc := range []struct {
		name  string
		entry func(t *testing.T, f fixture) (string, any)
		want  Summary
		kept  bool
	}{
		{"poison", func(*testing.T, fixture) (string, any) { return termination("process", "malformed assignment") }, Summary{RejectionsDropped: 1}, false},
		{"exhausted without an ID", func(*testing.T, fixture) (string, any) { return termination("process", "deliveries exhausted") }, Summary{RejectionsDropped: 1}, false},
		{"another backend's consumer", func(*testing.T, fixture) (string, any) {
			return termination("pod", taskassignment.RejectedReason("linux-1", "x"))
		}, Summary{RejectionsDropped: 1}, false},
		{"not JSON", func(*testing.T, fixture) (string, any) { return terminated + "process", json.RawMessage(`"x"`) }, Summary{RejectionsDropped: 1}, false},
		{"unknown pool", func(*testing.T, fixture) (string, any) {
			return termination("process", taskassignment.RejectedReason("gpu-1", "x"))
		}, Summary{RejectionsLeft: 1}, true},
		{"past MaxDeliver, gone", func(*testing.T, fixture) (string, any) {
			return maxDeliver + "process", server.JSConsumerDeliveryExceededAdvisory{
				TypedEvent: server.TypedEvent{Type: server.JSConsumerDeliveryExceededAdvisoryType},
				Stream:     "CI_RUNNER", Consumer: "process", StreamSeq: 99, Deliveries: 1}
		}, Summary{RejectionsDropped: 1}, false},
		{"past MaxDeliver, forged", func(t *testing.T, f fixture) (string, any) {
			ack, err := f.js.Publish(context.Background(), assignmentqueue.Subject(taskassignment.BackendProcess), []byte("unsigned"))
			if err != nil {
				t.Fatal(err)
			}
			return maxDeliver + "process", server.JSConsumerDeliveryExceededAdvisory{
				TypedEvent: server.TypedEvent{Type: server.JSConsumerDeliveryExceededAdvisoryType},
				Stream:     "CI_RUNNER", Consumer: "process", StreamSeq: ack.Sequence, Deliveries: 1}
		}, Summary{RejectionsDropped: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, g := withRejections(t)
			ctx := context.Background()
			a := f.claimed(t, 1, false) // linux-1's payload
			subject, event := tc.entry(t, f)
			data, err := json.Marshal(event)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.js.Publish(ctx, subject, data); err != nil {
				t.Fatal(err)
			}
			sum, err := f.r.Drain(ctx)
			if err != nil || sum != tc.want {
				t.Fatalf("Drain = %+v, %v; want %+v", sum, err, tc.want)
			}
			if len(g.reported) != 0 || !f.hasPayload(t, a.ID) {
				t.Fatalf("reported %v, payload %v: want nothing touched", g.reported, f.hasPayload(t, a.ID))
			}
			left, err := f.queue.Rejections(ctx, 0)
			if err != nil || (len(left) == 1) != tc.kept {
				t.Fatalf("entries left %+v, %v; want kept %v", left, err, tc.kept)
			}
			if s, _ := f.js.Stream(ctx, f.queue.Stream()); s.CachedInfo().State.Msgs != 0 {
				t.Fatalf("queue holds %d messages", s.CachedInfo().State.Msgs)
			}
		})
	}
}
