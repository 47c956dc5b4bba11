package pull

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// decided answers each notice with the decision its script gives for the
// notice's assignment (the last one for every later delivery) and counts the
// notices it was asked about.
type decided struct {
	mu     sync.Mutex
	script map[string][]taskassignment.NoticeDecision
	asked  map[string]int
	// onAsk, when set, runs before each answer (a SIGTERM arriving).
	onAsk func()
}

func (d *decided) Handle(_ context.Context, body []byte) taskassignment.NoticeDecision {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.onAsk != nil {
		d.onAsk()
	}
	id := string(body)
	n := d.asked[id]
	d.asked[id]++
	s := d.script[id]
	if len(s) == 0 {
		return taskassignment.NoticeDecision{Assignment: id, Outcome: taskassignment.NoticeDropped, Reason: "not in the script", Err: errors.New(id)}
	}
	dec := s[min(n, len(s)-1)]
	dec.Assignment = id
	return dec
}

func (d *decided) times(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asked[id]
}

var (
	finished = taskassignment.NoticeDecision{Outcome: taskassignment.NoticeFinished}
	absent   = taskassignment.NoticeDecision{Outcome: taskassignment.NoticeAbsent}
)

func retryAfter(d time.Duration) taskassignment.NoticeDecision {
	return taskassignment.NoticeDecision{Outcome: taskassignment.NoticeRetry, RetryAfter: d, Err: errors.New("not ended yet")}
}

// noticeStream is the finish notices' stream of the process backend on a
// real server, its consumer, and the adapter over it with script.
func noticeStream(t *testing.T, script map[string][]taskassignment.NoticeDecision) (Notices, *decided, jetstream.Consumer, func(ids ...string), func() uint64) {
	t.Helper()
	ctx := context.Background()
	env := jetstreamenv.NewQueue(t)
	f := assignmentqueue.NewFinished(env.JetStream, "")
	if err := f.Ensure(ctx, taskassignment.BackendProcess); err != nil {
		t.Fatal(err)
	}
	c, err := f.Consumer(ctx, taskassignment.BackendProcess)
	if err != nil {
		t.Fatal(err)
	}
	d := &decided{script: script, asked: map[string]int{}}
	publish := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if err := f.Publish(ctx, taskassignment.BackendProcess, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	left := func() uint64 {
		t.Helper()
		s, err := env.JetStream.Stream(ctx, f.Stream())
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	return Notices{Decider: d, Backend: taskassignment.BackendProcess, Consumer: c, Batch: 4, Wait: 500 * time.Millisecond}, d, c, publish, left
}

// Finished and absent notices are acknowledged (gone from the stream), a
// dropped one terminated (gone too), a retried one naked: it comes back
// after its decision's delay, not before.
func TestNoticesSettleByTheDecision(t *testing.T) {
	n, d, _, publish, left := noticeStream(t, map[string][]taskassignment.NoticeDecision{
		"linux-1": {finished}, "linux-2": {absent}, "linux-3": {retryAfter(time.Second), finished},
	})
	publish("linux-1", "linux-2", "linux-3", "windows-4")
	sum, err := n.Run(context.Background())
	if want := (NoticeSummary{Fetched: 4, Finished: 1, Absent: 1, Retried: 1, Dropped: 1}); err != nil || sum != want {
		t.Fatalf("Run() = %+v, %v; want %+v", sum, err, want)
	}
	if got := left(); got != 1 {
		t.Fatalf("%d notices left in the stream, want the retried one", got)
	}
	// Not before its delay: a run at once finds nothing.
	if sum, err := n.Run(context.Background()); err != nil || sum.Fetched != 0 {
		t.Fatalf("Run() within the delay = %+v, %v; want nothing fetched", sum, err)
	}
	time.Sleep(time.Second)
	if sum, err := n.Run(context.Background()); err != nil || sum != (NoticeSummary{Fetched: 1, Finished: 1}) {
		t.Fatalf("Run() after the delay = %+v, %v", sum, err)
	}
	if d.times("linux-3") != 2 || left() != 0 {
		t.Fatalf("linux-3 decided %d times, %d notices left", d.times("linux-3"), left())
	}
}

// A notice whose executor never ends is terminated on its last delivery,
// never left in the stream undeliverable.
func TestNoticeIsDroppedOnItsLastDelivery(t *testing.T) {
	n, d, _, publish, left := noticeStream(t, map[string][]taskassignment.NoticeDecision{"linux-1": {retryAfter(50 * time.Millisecond)}})
	publish("linux-1")
	var total NoticeSummary
	for range taskassignment.FinishedMaxDeliver {
		sum, err := n.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		total.Fetched += sum.Fetched
		total.Retried += sum.Retried
		total.Dropped += sum.Dropped
		time.Sleep(100 * time.Millisecond)
	}
	// The fault: every delivery was decided a retry.
	if got := d.times("linux-1"); got != taskassignment.FinishedMaxDeliver {
		t.Fatalf("decided %d times, want %d", got, taskassignment.FinishedMaxDeliver)
	}
	want := NoticeSummary{Fetched: taskassignment.FinishedMaxDeliver, Retried: taskassignment.FinishedMaxDeliver - 1, Dropped: 1}
	if total != want {
		t.Fatalf("over %d runs: %+v, want %+v", taskassignment.FinishedMaxDeliver, total, want)
	}
	if got := left(); got != 0 {
		t.Fatalf("%d notices left in the stream", got)
	}
}

// SIGTERM during a batch hands back every notice not finished, at once: they
// are deliverable again without waiting for the ack wait or a retry delay.
func TestSIGTERMHandsNoticesBack(t *testing.T) {
	ids := []string{"linux-1", "linux-2", "linux-3"}
	script := map[string][]taskassignment.NoticeDecision{}
	for _, id := range ids {
		script[id] = []taskassignment.NoticeDecision{retryAfter(time.Hour)} // naked with its delay, it would not come back
	}
	n, d, c, publish, _ := noticeStream(t, script)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d.onAsk = cancel
	publish(ids...)
	sum, err := n.Run(ctx)
	if err != nil || sum.Fetched == 0 || sum.Retried != sum.Fetched {
		t.Fatalf("Run() = %+v, %v; want every fetched notice handed back", sum, err)
	}
	if ctx.Err() == nil || d.times("linux-1") != 1 {
		t.Fatal("the run was not cancelled during its batch")
	}
	batch, err := c.Fetch(3, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	again := 0
	for range batch.Messages() {
		again++
	}
	if again != 3 {
		t.Fatalf("%d of 3 notices deliverable again at once", again)
	}
}
