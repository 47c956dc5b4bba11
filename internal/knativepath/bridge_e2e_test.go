//go:build e2e

package knativepath

import (
	"context"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestE2EKnativeHarnessBridge proves the harness before the channel and
// dispatch's CloudEvents publisher exist: dispatch publishes to JetStream as
// today, the test takes the assignment off the queue and posts it to
// handle's http mode with a CloudEvents client, and the job runs to success
// through the executor, the gateway and Gitea; recover's ticks clean up.
func TestE2EKnativeHarnessBridge(t *testing.T) {
	started := time.Now()
	e := newEnv(t)
	e.startDispatch()
	recover := e.startRecover()
	handle := e.startHandle()
	ctx := context.Background()
	consumer, err := assignmentqueue.New(e.js, "").OpenConsumer(ctx, taskassignment.BackendProcess, 10)
	if err != nil {
		t.Fatal(err)
	}

	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml", "name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo knative-bridge-ok\n")
	var body []byte
	var msgID string
	e.waitFor("an assignment on the queue", 30*time.Second, func() bool {
		batch, err := consumer.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			body, msgID = m.Data(), m.Headers().Get("Nats-Msg-Id")
			_ = m.Ack()
		}
		return body != nil
	})

	client, err := cloudevents.NewClientHTTP()
	if err != nil {
		t.Fatal(err)
	}
	ev := cloudevents.NewEvent()
	ev.SetID(msgID)
	ev.SetSource("dispatch")
	ev.SetType(taskassignment.EventType)
	if err := ev.SetData(cloudevents.ApplicationJSON, body); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second send finds the executor
		res := client.Send(cloudevents.ContextWithTarget(ctx, handle.url), ev)
		var hr *cehttp.Result
		if !cloudevents.ResultAs(res, &hr) || hr.StatusCode != 202 {
			t.Fatalf("handle answered %v, want 202", res)
		}
	}
	if ex := e.executors(); len(ex) != 1 {
		t.Fatalf("executors %v, want one", ex)
	}
	e.ticking(recover, time.Second)
	job := e.waitJob("build", 90*time.Second)
	if job.Conclusion != "success" {
		t.Fatalf("job %+v", job)
	}
	if logs := e.gitea.JobLogs(t, e.repo, job.ID); !strings.Contains(logs, "knative-bridge-ok") {
		t.Fatalf("job log:\n%s", logs)
	}
	e.waitFor("no executor and no payload left", 30*time.Second, func() bool {
		return len(e.executors()) == 0 && len(e.payloadIDs()) == 0
	})
	t.Logf("done in %v", time.Since(started).Round(time.Millisecond))
}
