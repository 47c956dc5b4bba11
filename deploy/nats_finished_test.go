package deploy

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor/executortest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/pull"
)

// TestNATSFinishNotices runs, as each user of the shipped authorization block, the calls the
// finish notices take (shared/assignmentqueue finished.go): dispatch and handle-setup converge
// their stream (handle-setup also the backend's consumer), the gateway publishes, recover's
// finish mode binds the consumer, fetches and settles (shared/recoverer Notices); and what each
// must not do with them.
func TestNATSFinishNotices(t *testing.T) {
	srv := startAuthorizedNATS(t, readAuthorization(t))
	pod := taskassignment.BackendPod

	// dispatch: functions/dispatch newService(): Finished.Ensure, the stream only.
	dispatch := srv.connect(t, "DISPATCH")
	if !t.Run("dispatch", func(t *testing.T) {
		ctx := flowContext(t)
		if err := assignmentqueue.NewFinished(dispatch.js, "").Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		dispatch.clean(t)
	}) {
		return
	}

	// handle-setup: functions/handle serve() in setup mode: Finished.Ensure with its backend.
	setup := srv.connect(t, "HANDLE_SETUP")
	if !t.Run("handle-setup", func(t *testing.T) {
		ctx := flowContext(t)
		if err := assignmentqueue.NewFinished(setup.js, "").Ensure(ctx, pod); err != nil {
			t.Fatal(err)
		}
		setup.clean(t)
	}) {
		return
	}

	// gateway: shared/gateway notifyFinished: Finished.Publish, as functions/gateway builds it.
	gateway := srv.connect(t, "GATEWAY")
	if !t.Run("gateway", func(t *testing.T) {
		ctx := flowContext(t)
		f := assignmentqueue.NewFinished(gateway.js, "")
		for _, id := range []string{"linux-1", "linux-2", "linux-1"} { // the last: a duplicate
			if err := f.Publish(ctx, pod, id); err != nil {
				t.Fatal(err)
			}
		}
		gateway.clean(t)
		gateway.denied(t, "consume the notices", "$JS.API.CONSUMER.INFO.CI_RUNNER_FINISHED.pod", func(ctx context.Context) error {
			_, err := f.Consumer(ctx, pod)
			return err
		})
		gateway.denied(t, "converge the notices' stream", "$JS.API.STREAM.INFO.CI_RUNNER_FINISHED", func(ctx context.Context) error {
			return f.Ensure(ctx)
		})
	}) {
		return
	}

	// recover, finish mode: functions/recover finish(): Finished.Consumer, then shared/recoverer
	// Notices.Run: Fetch, Metadata, and Ack (here: no executor), NakWithDelay / Nak (not ended
	// yet, shutdown) or TermWithReason (last delivery, malformed).
	recoverC := srv.connect(t, "RECOVER")
	if !t.Run("recover", func(t *testing.T) {
		ctx := flowContext(t)
		f := assignmentqueue.NewFinished(recoverC.js, "")
		consumer, err := f.Consumer(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		// One notice settled by hand through every settling call.
		msgs, err := consumer.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for msg := range msgs.Messages() {
			if _, err := msg.Metadata(); err != nil {
				t.Fatal(err)
			}
			if err := msg.NakWithDelay(time.Millisecond); err != nil {
				t.Fatal(err)
			}
			again, err := consumer.Next(jetstream.FetchMaxWait(5 * time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := again.Nak(); err != nil {
				t.Fatal(err)
			}
			again, err = consumer.Next(jetstream.FetchMaxWait(5 * time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := again.TermWithReason("deliveries exhausted: left to recover's periodic pass"); err != nil {
				t.Fatal(err)
			}
		}
		// The other through the real run: no executor, acknowledged.
		mem := executortest.NewMemory("")
		r := &recoverer.Recoverer{Pools: map[string]recoverer.Pool{"linux": {Pool: runnerpool.Pool{Name: "linux", Backend: pod, Capacity: 1}}}}
		n := pull.Notices{Decider: recoverer.NoticeHandler{Recoverer: r, Backend: pod, Executors: mem}, Backend: pod, Consumer: consumer, Batch: 4, Wait: time.Second}
		sum, err := n.Run(ctx)
		if err != nil || sum != (pull.NoticeSummary{Fetched: 1, Absent: 1}) {
			t.Fatalf("Notices.Run() = %+v, %v", sum, err)
		}
		recoverC.clean(t)
		recoverC.denied(t, "create a notices consumer", "$JS.API.CONSUMER.CREATE.CI_RUNNER_FINISHED", func(ctx context.Context) error {
			_, err := recoverC.js.CreateOrUpdateConsumer(ctx, f.Stream(), jetstream.ConsumerConfig{Durable: "pod", FilterSubject: "ci.finished.pod", AckPolicy: jetstream.AckExplicitPolicy})
			return err
		})
		recoverC.denied(t, "converge the notices' stream", "$JS.API.STREAM.INFO.CI_RUNNER_FINISHED", func(ctx context.Context) error {
			return f.Ensure(ctx)
		})
		recoverC.denied(t, "publish a notice", "ci.finished.pod", func(ctx context.Context) error {
			return f.Publish(ctx, pod, "linux-3")
		})
	}) {
		return
	}

	// handle (job mode) and dispatch have no business with the notices.
	t.Run("others", func(t *testing.T) {
		handle := srv.connect(t, "HANDLE_POD")
		handle.denied(t, "consume the notices", "$JS.API.CONSUMER.INFO.CI_RUNNER_FINISHED.pod", func(ctx context.Context) error {
			_, err := assignmentqueue.NewFinished(handle.js, "").Consumer(ctx, pod)
			return err
		})
		handle.denied(t, "publish a notice", "ci.finished.pod", func(ctx context.Context) error {
			return assignmentqueue.NewFinished(handle.js, "").Publish(ctx, pod, "linux-3")
		})
		dispatch.denied(t, "fetch the notices", "$JS.API.CONSUMER.MSG.NEXT.CI_RUNNER_FINISHED.pod", func(ctx context.Context) error {
			_, err := dispatch.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT.CI_RUNNER_FINISHED.pod", []byte(`{"batch":1}`))
			return err
		})
	})
}
