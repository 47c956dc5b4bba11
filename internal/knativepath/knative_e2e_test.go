//go:build e2e

package knativepath

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/channelenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// The contract of the Knative path's events (dispatch and recover with
// GDR_PUBLISH=cloudevents; handle's rejection replies).
const (
	backendExtension = "gdrbackend"
	rejectionType    = "io.gitea-dynamic-runner.rejection.v1"
)

// shippedManifest is the channel and subscription the Knative install
// applies; shippedSubscription is the subscription of handle in it.
const (
	shippedManifest     = "../../deploy/knative/10-channel.yaml"
	shippedSubscription = "handle-pod"
)

// shippedDelivery is the subscription's delivery as deploy/knative ships it.
func shippedDelivery(t *testing.T) channelenv.Delivery {
	t.Helper()
	d, err := channelenv.LoadDelivery(shippedManifest, shippedSubscription)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// knative is the whole Knative path of one test: the channel (its
// subscriber handle, or a relay in front of handle), a tap in front of the
// channel's ingress recording what dispatch publishes, dispatch and recover
// publishing CloudEvents, and handle and recover in http mode.
type knative struct {
	*env
	channel *channelenv.Channel
	tap     *relay
	handle  *proc
	recover *proc
}

// startKnative starts the path. subscriber is where the channel delivers
// (handle's URL, or a relay's in front of it); handleEnv is added to
// handle's environment.
func startKnative(t *testing.T, e *env, subscriber string, delivery channelenv.Delivery, handleEnv ...string) *knative {
	t.Helper()
	k := &knative{env: e}
	deadLetter := e.recoverURL + "/dead-letter"
	k.channel = channelenv.Start(t, e.natsURL, channelenv.Options{
		Subscriber: subscriber, Reply: deadLetter, DeadLetter: deadLetter, Delivery: delivery, MaxAckPending: 2,
	})
	k.tap = newRelay(t, k.channel.URL(), 0)
	// GDR_ORPHAN_GRACE is long: no orphan is re-sent behind the test's back
	// (the channel's delivery is what is tested).
	e.startDispatch("GDR_PUBLISH=cloudevents", "GDR_EVENT_SINK="+k.tap.URL)
	k.recover = e.startRecover("GDR_PUBLISH=cloudevents", "GDR_EVENT_SINK="+k.channel.URL(), "GDR_ORPHAN_GRACE=10m")
	k.handle = e.startHandle(handleEnv...)
	return k
}

// published waits for dispatch's first CloudEvent through the tap, checks
// it against the contract (id = assignment ID, type, gdrbackend, data = the
// assignment signed by dispatch's key) and returns it with its assignment.
func (k *knative) published(timeout time.Duration) (request, taskassignment.Assignment) {
	t := k.t
	t.Helper()
	k.waitFor("dispatch publishes an assignment to the channel", timeout, func() bool { return len(k.tap.requests("")) > 0 })
	q := k.tap.requests("")[0]
	req, err := http.NewRequest(http.MethodPost, k.channel.URL(), strings.NewReader(string(q.Body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = q.Header.Clone()
	ev, err := cehttp.NewEventFromHTTPRequest(req)
	if err != nil {
		t.Fatalf("dispatch published no CloudEvent: %v", err)
	}
	if q.Status != http.StatusAccepted {
		t.Fatalf("the channel's ingress answered dispatch %d, want 202", q.Status)
	}
	msg, err := k.signer.Open(ev.Data())
	if err != nil {
		t.Fatalf("the event's data is not the assignment signed by dispatch's key: %v", err)
	}
	a, err := taskassignment.Decode(msg, k.td)
	if err != nil {
		t.Fatalf("the event's data does not decode: %v", err)
	}
	backend, _ := ev.Extensions()[backendExtension].(string)
	if ev.ID() != a.ID || ev.Type() != taskassignment.EventType || backend != string(taskassignment.BackendProcess) ||
		a.Task.Pool != poolName || a.Identity.Repository != k.repo {
		t.Fatalf("event id %q, type %q, %s %q; assignment %+v: want id = assignment ID, type %s, %s process, pool %s, repository %s",
			ev.ID(), ev.Type(), backendExtension, backend, a, taskassignment.EventType, backendExtension, poolName, k.repo)
	}
	return q, a
}

// send posts ev straight to handle and returns the HTTP status.
func (k *knative) send(ev cloudevents.Event) int {
	t := k.t
	t.Helper()
	client, err := cloudevents.NewClientHTTP()
	if err != nil {
		t.Fatal(err)
	}
	res := client.Send(cloudevents.ContextWithTarget(context.Background(), k.handle.url), ev)
	var hr *cehttp.Result
	if !cloudevents.ResultAs(res, &hr) {
		t.Fatalf("post to handle: %v", res)
	}
	return hr.StatusCode
}

// settled waits (10 s at most) until the channel is done with event id:
// its last delivery acknowledged, terminated or dead-lettered, or its
// deliveries spent; and returns the deliveries.
func (k *knative) settled(id string) []channelenv.Attempt {
	deadline := time.Now().Add(10 * time.Second)
	for {
		as := k.channel.Deliveries(id)
		if n := len(as); n > 0 {
			last := as[n-1]
			if last.Result != channelenv.Nak || last.DeadLetter != nil || last.N >= k.channel.Delivery().MaxDeliver() {
				return as
			}
		}
		if time.Now().After(deadline) {
			return as
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// assignmentEvent is an assignment event as dispatch publishes it, with
// data as given.
func assignmentEvent(t *testing.T, id string, data []byte) cloudevents.Event {
	t.Helper()
	ev := cloudevents.NewEvent()
	ev.SetID(id)
	ev.SetSource("knativepath-test")
	ev.SetType(taskassignment.EventType)
	ev.SetExtension(backendExtension, string(taskassignment.BackendProcess))
	if err := ev.SetData(cloudevents.ApplicationJSON, data); err != nil {
		t.Fatal(err)
	}
	return ev
}

// timeline is the channel's deliveries of one event, one line each, as
// offsets from the first.
func timeline(as []channelenv.Attempt) string {
	var b strings.Builder
	for _, a := range as {
		fmt.Fprintf(&b, "  +%5.1fs delivery %d: status %d -> %s", a.Time.Sub(as[0].Time).Seconds(), a.N, a.Status, a.Result)
		if a.Delay > 0 {
			fmt.Fprintf(&b, " (again in %v)", a.Delay)
		}
		if a.DeadLetter != nil {
			fmt.Fprintf(&b, "; dead letter to %s: %d", a.DeadLetter.URL, a.DeadLetter.Status)
		}
		if a.Reply != nil {
			fmt.Fprintf(&b, "; reply to %s: %d", a.Reply.URL, a.Reply.Status)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestE2EKnativeJobRunsToSuccess: a pushed job goes dispatch (CloudEvents)
// -> channel -> handle (http) -> executor -> gateway -> Gitea and ends
// success with its step's output in its log. The same event sent again,
// through the channel and straight to handle, creates no second executor;
// an unsigned event and one signed by another key are refused (400) and
// create nothing. recover's ticks then leave nothing behind.
func TestE2EKnativeJobRunsToSuccess(t *testing.T) {
	started := time.Now()
	e := newEnv(t)
	k := startKnative(t, e, e.handleURL, shippedDelivery(t))
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml",
		"name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo knative-says-$((6*7))\n")

	q, a := k.published(60 * time.Second)
	e.waitFor("the executor of "+a.ID, 30*time.Second, func() bool { return e.executors()[a.ID].PID > 0 })
	first := e.executors()[a.ID]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	as, err := k.channel.WaitDeliveries(ctx, a.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	if as[0].Status != http.StatusAccepted || as[0].Result != channelenv.Ack {
		t.Fatalf("the channel's delivery to handle:\n%s", timeline(as))
	}

	// The same event again: the channel stores it once (Nats-Msg-Id = event
	// id), and handle finds the executor it created.
	if code := resend(t, k.channel.URL(), q); code != http.StatusAccepted {
		t.Fatalf("the channel's ingress answered the event sent again %d, want 202", code)
	}
	if code := resend(t, k.handle.url, q); code != http.StatusAccepted {
		t.Fatalf("handle answered the event sent again %d, want 202 (its executor exists)", code)
	}
	time.Sleep(3 * time.Second) // time for a second delivery, if there were one
	if as := k.channel.Deliveries(a.ID); len(as) != 1 {
		t.Fatalf("the channel delivered the event %d times, want once:\n%s", len(as), timeline(as))
	}
	if ex := e.executors(); len(ex) != 1 || ex[a.ID] != first {
		t.Fatalf("executors %v after the event was sent again, want only %v", ex, first)
	}

	// Unsigned, and signed by a key handle does not know: refused, nothing
	// created.
	id, err := taskidentity.New(e.td, e.repo, "forged", 4242)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := taskassignment.New(taskassignment.BackendProcess, taskassignment.Task{ID: 4242, Pool: poolName}, id)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := taskassignment.Encode(forged)
	if err != nil {
		t.Fatal(err)
	}
	other, err := assignmentsig.NewSigner(randomKey(t, 32))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := other.Seal(raw)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"unsigned": raw, "signed by another key": sealed} {
		if code := k.send(assignmentEvent(t, forged.ID, data)); code != http.StatusBadRequest {
			t.Errorf("handle answered an event %s with %d, want 400", name, code)
		}
	}
	if ex := e.executors(); len(ex) != 1 || ex[a.ID] != first {
		t.Fatalf("executors %v after the forged events, want only %v", ex, first)
	}

	e.ticking(k.recover, time.Second) // as the PingSource would, faster
	job := e.waitJob("build", 90*time.Second)
	if job.Conclusion != "success" {
		t.Fatalf("job %+v, want success", job)
	}
	if logs := e.gitea.JobLogs(t, e.repo, job.ID); !strings.Contains(logs, "knative-says-42") {
		t.Fatalf("the job's log lacks its step's output:\n%s", logs)
	}
	e.waitFor("no executor and no payload left", 30*time.Second, func() bool {
		return len(e.executors()) == 0 && len(e.payloadIDs()) == 0
	})
	t.Logf("push to clean, through the channel: %v", time.Since(started).Round(time.Millisecond))
}

// notYetFor is how long the relay in front of handle answers 503 in
// TestE2EKnativeNotYetSurvivesALongWait: longer than a Pod may wait to be
// scheduled on a busy cluster, and past the channel's AckWait (31 s).
const notYetFor = 40 * time.Second

// TestE2EKnativeNotYetSurvivesALongWait: with the delivery deploy/knative
// ships, an assignment that is "not yet" (503) for notYetFor is still
// delivered after more than 31 s, and its job runs once handle takes it.
// The relay simulates the scheduling wait: the process backend's executors
// never wait for their identity target.
func TestE2EKnativeNotYetSurvivesALongWait(t *testing.T) {
	started := time.Now()
	e := newEnv(t)
	delivery := shippedDelivery(t)
	t.Logf("shipped delivery: retry %d, %s backoff from %v, timeout %v: %v of backoff in all",
		delivery.Retry, delivery.BackoffPolicy, delivery.BackoffDelay, delivery.Timeout, delivery.Span())
	gate := newRelay(t, e.handleURL, notYetFor)
	k := startKnative(t, e, gate.URL, delivery)
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml",
		"name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo waited-and-ran\n")
	_, a := k.published(60 * time.Second)

	e.ticking(k.recover, 2*time.Second)
	job := e.waitJob("build", 150*time.Second)
	as := k.settled(a.ID)
	t.Logf("the channel's deliveries of %s:\n%s", a.ID, timeline(as))
	logs := e.gitea.JobLogs(t, e.repo, job.ID)
	if job.Conclusion != "success" {
		t.Fatalf("job %s %s after %v, want success once handle took it; its log:\n%s",
			job.Status, job.Conclusion, time.Since(as[0].Time).Round(time.Second), logs)
	}
	if !strings.Contains(logs, "waited-and-ran") {
		t.Fatalf("the job's log lacks its step's output:\n%s", logs)
	}
	last := as[len(as)-1]
	if last.Status != http.StatusAccepted || last.Time.Sub(as[0].Time) <= 31*time.Second {
		t.Fatalf("want the assignment accepted by a delivery more than 31 s after the first:\n%s", timeline(as))
	}
	e.waitFor("no executor and no payload left", 30*time.Second, func() bool {
		return len(e.executors()) == 0 && len(e.payloadIDs()) == 0
	})
	t.Logf("push to clean: %v", time.Since(started).Round(time.Millisecond))
}

// TestE2EKnativeDeadLetterIsRecovered: an assignment that can never be taken
// (the relay in front of handle answers 503 forever) is given up after a
// small delivery (retry 2, PT1S) and dead-lettered to recover's POST
// /dead-letter; recover fails the task in Gitea with a readable reason in
// its log, and nothing is left (no executor, no payload), without a tick.
func TestE2EKnativeDeadLetterIsRecovered(t *testing.T) {
	started := time.Now()
	e := newEnv(t)
	delivery := shippedDelivery(t)
	delivery.Retry, delivery.BackoffDelay = 2, time.Second
	gate := newRelay(t, e.handleURL, -1)
	k := startKnative(t, e, gate.URL, delivery)
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml",
		"name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo never-runs\n")
	_, a := k.published(60 * time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	as, err := k.channel.WaitDeliveries(ctx, a.ID, delivery.MaxDeliver())
	t.Logf("the channel's deliveries of %s:\n%s", a.ID, timeline(as))
	if err != nil {
		t.Fatal(err)
	}
	last := as[len(as)-1]
	if last.DeadLetter == nil || last.DeadLetter.Status/100 != 2 {
		t.Fatalf("the last delivery's dead letter: %+v, want recover to take it (2xx)", last.DeadLetter)
	}

	// No tick: the dead letter alone fails the task and frees its payload.
	job := e.waitJob("build", 30*time.Second)
	if job.Conclusion != "failure" {
		t.Fatalf("job %+v, want failure", job)
	}
	logs := e.gitea.JobLogs(t, e.repo, job.ID)
	if strings.Contains(logs, "never-runs") || !strings.Contains(strings.ToLower(logs), "deliver") || !strings.Contains(logs, "503") {
		t.Fatalf("want the job's log to say the assignment could not be delivered, with handle's last answer (503), and no step run:\n%s", logs)
	}
	t.Logf("the job's log:\n%s", logs)
	e.waitFor("no executor and no payload left", 30*time.Second, func() bool {
		return len(e.executors()) == 0 && len(e.payloadIDs()) == 0
	})
	if n := len(gate.requests(a.ID)); n != delivery.MaxDeliver() {
		t.Errorf("the relay saw %d deliveries, want %d", n, delivery.MaxDeliver())
	}
	t.Logf("push to clean: %v", time.Since(started).Round(time.Millisecond))
}

// TestE2EKnativeRejectedTaskFailsAtOnce: an assignment handle's backend can
// never take (here: the process backend's runner binary does not exist, a
// permanent error) is answered 200 with a rejection reply; the channel acks
// it and takes the reply to recover's POST /dead-letter (the Subscription's
// reply), and recover fails the task with handle's reason at once: one
// delivery, no retry, no tick, nothing left.
func TestE2EKnativeRejectedTaskFailsAtOnce(t *testing.T) {
	started := time.Now()
	e := newEnv(t)
	k := startKnative(t, e, e.handleURL, shippedDelivery(t), "GDR_RUNNER_BIN="+filepath.Join(t.TempDir(), "no-such-runner"))
	e.gitea.PushWorkflow(t, e.repo, ".gitea/workflows/ci.yml",
		"name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo never-runs\n")
	_, a := k.published(60 * time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	as, err := k.channel.WaitDeliveries(ctx, a.ID, 1)
	t.Logf("the channel's deliveries of %s:\n%s", a.ID, timeline(as))
	if err != nil {
		t.Fatal(err)
	}
	first := as[0]
	if first.Status != http.StatusOK || first.Reply == nil || first.Reply.Status/100 != 2 {
		t.Fatalf("first delivery: status %d, reply %+v; want 200 with a reply recover took (2xx)", first.Status, first.Reply)
	}
	job := e.waitJob("build", 30*time.Second)
	if job.Conclusion != "failure" {
		t.Fatalf("job %+v, want failure", job)
	}
	logs := e.gitea.JobLogs(t, e.repo, job.ID)
	if strings.Contains(logs, "never-runs") || !strings.Contains(logs, "handle refused its assignment") || !strings.Contains(logs, "no-such-runner") {
		t.Fatalf("want the job's log to carry handle's reason (the missing runner), and no step run:\n%s", logs)
	}
	t.Logf("the job's log:\n%s", logs)
	e.waitFor("no executor and no payload left", 30*time.Second, func() bool {
		return len(e.executors()) == 0 && len(e.payloadIDs()) == 0
	})
	if n := len(k.channel.Deliveries(a.ID)); n != 1 {
		t.Errorf("%d deliveries of a rejected assignment, want 1 (acknowledged, never retried)", n)
	}
	t.Logf("push to clean: %v", time.Since(started).Round(time.Millisecond))
}
