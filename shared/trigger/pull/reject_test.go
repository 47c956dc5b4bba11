package pull

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// rejections waits up to wait for n entries of env's rejection stream.
func rejections(t *testing.T, env *jetstreamenv.Queue, n int, wait time.Duration) []taskassignment.Rejection {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		got, err := env.Queue.Rejections(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestJobRejectsPermanentErrors: an assignment the backend can never accept
// is terminated at once with a reason naming it, captured for recover; a
// transient error is naked with backoff and captures nothing.
func TestJobRejectsPermanentErrors(t *testing.T) {
	invalid := errors.New(`Pod "gdr-linux-1" is invalid: spec.containers[0].image: Required value`)
	tests := []struct {
		name    string
		err     error
		want    Summary
		why     string // the reason recover reads; empty: nothing captured, the message stays queued
		backoff bool
	}{
		{"permanent", executor.Permanent(invalid), Summary{Fetched: 1, Rejected: 1},
			`create executor of assignment linux-1: Pod "gdr-linux-1" is invalid: spec.containers[0].image: Required value`, false},
		{"permanent, multi-line", executor.Permanent(errors.New("spec is invalid:\nimage: required")), Summary{Fetched: 1, Rejected: 1},
			"create executor of assignment linux-1: spec is invalid:; image: required", false},
		{"transient", errors.New("apiserver: 503"), Summary{Fetched: 1, Failed: 1}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := jetstreamenv.NewQueue(t)
			c := env.OpenConsumer(t, taskassignment.BackendProcess, 4)
			a := handlertest.Assignment(t, 1)
			publish(t, env.Queue, a)
			calls := 0
			accept := handlertest.AcceptFunc(func(_ context.Context, got taskassignment.Assignment) (bool, error) {
				calls++
				return false, fmt.Errorf("create executor of assignment %s: %w", got.ID, tt.err)
			})
			j := job(c, accept, nil)
			setDelays(&j, 0, time.Hour) // a naked message does not come back during the test
			sum, err := j.Run(context.Background())
			if err != nil || sum != tt.want {
				t.Fatalf("Run = %+v, %v; want %+v", sum, err, tt.want)
			}
			if queued := queuedOnceSettled(t, env.Queue, a.ID, tt.backoff); queued != tt.backoff {
				t.Fatalf("assignment %s queued: %v, want %v", a.ID, queued, tt.backoff)
			}
			if tt.backoff {
				info, err := c.Info(context.Background())
				if err != nil || info.NumAckPending != 1 || info.NumRedelivered != 0 {
					t.Fatalf("consumer %+v, %v: want the message waiting out its backoff", info, err)
				}
				if got := rejections(t, env, 1, 500*time.Millisecond); len(got) != 0 {
					t.Fatalf("a transient error was captured as a rejection: %+v", got)
				}
				return
			}
			got := rejections(t, env, 1, 5*time.Second)
			if len(got) != 1 {
				t.Fatalf("rejections = %+v, want one", got)
			}
			id, why, exhausted, ok := got[0].Cause()
			if !ok || id != a.ID || exhausted || why != tt.why || got[0].Consumer != string(taskassignment.BackendProcess) {
				t.Fatalf("captured %+v: Cause = %q, %q, %v, %v; want %s, %q", got[0], id, why, exhausted, ok, a.ID, tt.why)
			}
			// Nothing comes back: a second run fetches nothing.
			if sum, err := job(c, accept, nil).Run(context.Background()); err != nil || sum.Fetched != 0 || calls != 1 {
				t.Fatalf("second run %+v, %v, %d Accept calls", sum, err, calls)
			}
		})
	}
}

// TestJobExhaustedReasonNamesTheAssignment: a message handed back on its
// last delivery, failed, waiting or at shutdown, is terminated with a reason
// naming its assignment, so recover can fail that task.
func TestJobExhaustedReasonNamesTheAssignment(t *testing.T) {
	tests := []struct {
		name     string
		accept   handlertest.AcceptFunc
		shutdown bool
	}{
		{"failed", func(context.Context, taskassignment.Assignment) (bool, error) {
			return false, errors.New("backend unavailable")
		}, false},
		{"still waiting", func(context.Context, taskassignment.Assignment) (bool, error) { return false, nil }, false},
		{"shutdown", func(context.Context, taskassignment.Assignment) (bool, error) { return true, nil }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := jetstreamenv.NewQueue(t)
			c, err := env.JetStream.CreateOrUpdateConsumer(context.Background(), assignmentqueue.DefaultStream, jetstream.ConsumerConfig{
				Durable: string(taskassignment.BackendProcess), FilterSubject: assignmentqueue.Subject(taskassignment.BackendProcess),
				AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxDeliver: 1, MaxAckPending: 4,
			})
			if err != nil {
				t.Fatal(err)
			}
			a := handlertest.Assignment(t, 11)
			publish(t, env.Queue, a)
			j := job(c, tt.accept, nil)
			j.MaxDeliver, j.HoldFor = 1, time.Millisecond
			ctx := context.Background()
			if tt.shutdown {
				// The run fetches, then finds its context ended: the
				// message goes back unoffered.
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
				j.Consumer = cancelAfterFetch{Puller: c, cancel: cancel}
			}
			if _, err := j.Run(ctx); err != nil {
				t.Fatal(err)
			}
			got := rejections(t, env, 1, 5*time.Second)
			if len(got) != 1 {
				t.Fatalf("rejections = %+v, want one", got)
			}
			if id, why, exhausted, ok := got[0].Cause(); !ok || !exhausted || id != a.ID || why != "deliveries exhausted" {
				t.Fatalf("captured %q: Cause = %q, %q, %v, %v", got[0].Reason, id, why, exhausted, ok)
			}
		})
	}
}

// cancelAfterFetch cancels the run's context once its fetch has returned.
type cancelAfterFetch struct {
	Puller
	cancel context.CancelFunc
}

func (c cancelAfterFetch) Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Puller.Fetch(batch, opts...)
	if c.cancel != nil {
		// Let the message arrive first: the batch channel is filled as the
		// server delivers.
		time.Sleep(200 * time.Millisecond)
		c.cancel()
	}
	return b, err
}
