package pull

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// shortAckWait opens the process backend's consumer as handle does, but
// with ackWait instead of assignmentqueue.AckWait, so that a message its run
// neither settles nor keeps in progress comes back within the test.
func shortAckWait(t *testing.T, js jetstream.JetStream, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	c, err := js.CreateOrUpdateConsumer(context.Background(), assignmentqueue.DefaultStream, jetstream.ConsumerConfig{
		Durable: string(taskassignment.BackendProcess), FilterSubject: assignmentqueue.Subject(taskassignment.BackendProcess),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: taskassignment.MaxDeliver, MaxAckPending: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// script is a handler.Acceptor that answers each task's offers from a list (true:
// accepted, false: not yet; past its end, the last answer) and records the
// task of every offer, in order.
type script struct {
	mu      sync.Mutex
	answers map[int64][]bool
	offers  []int64
	offered chan int64 // receives every offer's task, if not nil
}

func (s *script) Accept(_ context.Context, a taskassignment.Assignment) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offers = append(s.offers, a.Task.ID)
	if s.offered != nil {
		s.offered <- a.Task.ID
	}
	answers := s.answers[a.Task.ID]
	n := 0
	for _, id := range s.offers {
		if id == a.Task.ID {
			n++
		}
	}
	return answers[min(n, len(answers))-1], nil
}

func (s *script) calls() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.offers...)
}

// expectOffers waits for n offers on offered, failing the test after
// within.
func expectOffers(t *testing.T, offered <-chan int64, n int, within time.Duration) {
	t.Helper()
	timeout := time.After(within)
	for i := range n {
		select {
		case <-offered:
		case <-timeout:
			t.Fatalf("%d offers within %v, want %d: the run does not hold", i, within, n)
		}
	}
}

// A message whose executor waits stays with its run for longer than
// AckWait, with one delivery: a competing run fetching meanwhile gets
// nothing, which it would the moment AckWait passed without an in-progress
// signal.
func TestJobHoldsNotYetWithinOneDelivery(t *testing.T) {
	const ackWait, nakDelay = time.Second, 600 * time.Millisecond
	env := jetstreamenv.NewQueue(t)
	c := shortAckWait(t, env.JetStream, ackWait)
	publish(t, env.Queue, handlertest.Assignment(t, 21))
	// Six holds (250 ms each: 1.5 s) outlast AckWait.
	s := &script{answers: map[int64][]bool{21: {false, false, false, false, false, false, true}}, offered: make(chan int64, 8)}
	j := job(c, s, nil)
	setDelays(&j, nakDelay, 0)
	j.HoldFor = time.Minute
	start := time.Now()
	done := runInBackground(context.Background(), j)
	expectOffers(t, s.offered, 1, 5*time.Second)
	// The competitor waits past the AckWait of the first delivery.
	got, err := c.Fetch(1, jetstream.FetchMaxWait(ackWait+500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range got.Messages() {
		md, _ := msg.Metadata()
		t.Errorf("a competing run got the held message (delivery %d)", md.NumDelivered)
	}
	r := <-done
	if r.err != nil || r.sum != (Summary{Fetched: 1, Accepted: 1}) {
		t.Fatalf("Run() = %+v, %v", r.sum, r.err)
	}
	var holds time.Duration
	for i := range 6 {
		holds += holdDelay(i, nakDelay)
	}
	if held := time.Since(start); held < holds || held <= ackWait {
		t.Fatalf("accepted after %v, want after six holds (%v) and past AckWait (%v)", held, holds, ackWait)
	}
	if n := len(s.calls()); n != 7 {
		t.Fatalf("%d offers, want 7", n)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Consumer != 1 {
		t.Fatalf("%d deliveries, want 1", info.Delivered.Consumer)
	}
	expectOutstanding(t, env.Queue, 0)
}

// Held messages of one batch wait side by side: neither waits for the
// other to be accepted.
func TestJobHoldsEachMessageOfABatch(t *testing.T) {
	q, c, _ := queue(t, 4)
	publish(t, q, handlertest.Assignment(t, 1))
	publish(t, q, handlertest.Assignment(t, 2))
	s := &script{answers: map[int64][]bool{1: {false, false, true}, 2: {false, false, true}}}
	j := job(c, s, nil)
	j.Batch = 2
	setDelays(&j, 300*time.Millisecond, 0)
	j.HoldFor = time.Minute
	sum, err := j.Run(context.Background())
	if err != nil || sum != (Summary{Fetched: 2, Accepted: 2}) {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
	if got, want := s.calls(), []int64{1, 2, 1, 2, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("offers by task %v, want %v", got, want)
	}
	expectOutstanding(t, q, 0)
}

// Past GDR_HOLD_FOR the run gives the message up: naked with the nak
// delay, counted not yet.
func TestJobHoldGivesUpAtItsBound(t *testing.T) {
	const nakDelay = 200 * time.Millisecond
	q, c, _ := queue(t, 4)
	publish(t, q, handlertest.Assignment(t, 4))
	s := &script{answers: map[int64][]bool{4: {false}}}
	j := job(c, s, nil)
	// Offers at 0, 200 and 400 ms; the next, at 600 ms, would be past the
	// bound. Each offer is scheduled from the end of the one before, so on a
	// loaded machine (a slow first Accept) the third may already fall past
	// the bound: two or three offers, never more.
	setDelays(&j, nakDelay, 0)
	j.HoldFor = 500 * time.Millisecond
	start := time.Now()
	sum, err := j.Run(context.Background())
	if err != nil || sum != (Summary{Fetched: 1, NotYet: 1}) {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
	if n, took := len(s.calls()), time.Since(start); n < 2 || n > 3 || took > 3*time.Second {
		t.Fatalf("%d offers in %v, want 2 or 3 within the bound", n, took)
	}
	if sum, delivered, err := takeBack(c, 5*time.Second); err != nil || sum.Accepted != 1 || delivered != 2 {
		t.Fatalf("the given-up message did not come back: %+v, %v, delivery %d", sum, err, delivered)
	}
}

// On SIGTERM (a cancelled context) a held message goes back at once, not
// after the nak delay nor the hold.
func TestJobShutdownHandsBackAHeldMessage(t *testing.T) {
	q, c, _ := queue(t, 4)
	publish(t, q, handlertest.Assignment(t, 6))
	s := &script{answers: map[int64][]bool{6: {false}}}
	var log logBuffer
	j := job(c, s, &log)
	setDelays(&j, time.Hour, 0)
	j.HoldFor = 2 * time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := runInBackground(ctx, j)
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(log.String(), "assignment held"); {
		if time.Now().After(deadline) {
			t.Fatalf("the run does not hold:\n%s", log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case r := <-done:
		if r.sum != (Summary{Fetched: 1, Failed: 1}) {
			t.Fatalf("summary = %+v, want the held message handed back", r.sum)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the run did not return on shutdown")
	}
	if sum, delivered, err := takeBack(c, time.Second); err != nil || sum.Accepted != 1 || delivered != 2 {
		t.Fatalf("the handed-back message did not come back at once: %+v, %v, delivery %d", sum, err, delivered)
	}
}

// kedaNewJobs is how many Jobs KEDA starts for a ScaledJob in one polling
// interval under its default scaling strategy (scalingStrategy "default",
// the one deploy/keda/03-handle-pod.yaml uses): the scaler's queue length
// over its target, rounded up and capped at maxReplicaCount, is maxScale;
// the default strategy starts maxScale minus the Jobs still running, never
// fewer than none. The nats-jetstream scaler's queue length is the
// consumer's num_pending + num_ack_pending (kedaLag), its target
// lagThreshold.
func kedaNewJobs(lag, lagThreshold, runningJobs, maxReplicaCount int64) int64 {
	maxScale := min((lag+lagThreshold-1)/lagThreshold, maxReplicaCount)
	return max(0, maxScale-runningJobs)
}

// kedaLag is the nats-jetstream scaler's lag of c, from the server's own
// consumer info.
func kedaLag(t *testing.T, c jetstream.Consumer) int64 {
	t.Helper()
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int64(info.NumPending) + int64(info.NumAckPending)
}

// KEDA's formula on the real server's numbers: while a run holds a waiting
// message, the holding run is the running Assignments that the lag asks for, and
// KEDA starts none; a run that hands the message back and exits (the old
// behaviour) leaves the same lag and no running Assignments, and KEDA starts a Assignments
// every polling interval, which fetches nothing.
// untilReleased is a handler.Acceptor whose executor waits (NotYet) until release is
// closed; it sends the task of every offer to offered.
func untilReleased(release <-chan struct{}, offered chan<- int64) handler.Acceptor {
	return handlertest.AcceptFunc(func(_ context.Context, a taskassignment.Assignment) (bool, error) {
		offered <- a.Task.ID
		select {
		case <-release:
			return true, nil
		default:
			return false, nil
		}
	})
}

func TestKEDAStartsNoJobForAHeldMessage(t *testing.T) {
	// deploy/keda/03-handle-pod.yaml: lagThreshold "1", maxReplicaCount 10.
	const lagThreshold, maxReplicaCount, polls = 1, 10, 3
	const pollingInterval = 100 * time.Millisecond
	// poll applies the formula polls times, starting and running the Jobs
	// it asks for (each fetches for a poll interval with accept, and exits),
	// and returns how many were started and what they fetched. wantLag, if
	// positive, is the lag every poll must see.
	poll := func(t *testing.T, c jetstream.Consumer, runningJobs int64, accept handler.Acceptor, wantLag int64) (started int64, fetched int) {
		for range polls {
			lag := kedaLag(t, c)
			if wantLag > 0 && lag != wantLag {
				t.Fatalf("lag %d, want %d: the waiting message is ack-pending", lag, wantLag)
			}
			n := kedaNewJobs(lag, lagThreshold, runningJobs, maxReplicaCount)
			for range n {
				extra := job(c, accept, nil)
				extra.Wait = pollingInterval
				sum, err := extra.Run(context.Background())
				if err != nil {
					t.Fatalf("a Assignments KEDA started = %+v, %v", sum, err)
				}
				fetched += sum.Fetched
			}
			started += n
			time.Sleep(pollingInterval)
		}
		return started, fetched
	}

	t.Run("held", func(t *testing.T) {
		q, c, _ := queue(t, 4)
		publish(t, q, handlertest.Assignment(t, 8))
		release := make(chan struct{})
		offered := make(chan int64, 64)
		waits := untilReleased(release, offered)
		j := job(c, waits, nil)
		setDelays(&j, 200*time.Millisecond, 0)
		j.HoldFor = time.Minute
		done := runInBackground(context.Background(), j)
		expectOffers(t, offered, 2, 5*time.Second) // offered again: held
		if n, _ := poll(t, c, 1, handlertest.AcceptFunc(handlertest.Never), 1); n != 0 {
			t.Fatalf("KEDA started %d Jobs while one run holds the message, want 0", n)
		}
		close(release)
		if r := <-done; r.err != nil || r.sum != (Summary{Fetched: 1, Accepted: 1}) {
			t.Fatalf("Run() = %+v, %v", r.sum, r.err)
		}
		expectOutstanding(t, q, 0)
	})

	// The warm handle's key case: a lingering run (GDR_LINGER > 0) that holds a
	// message fetches nothing more, and a second message queued meanwhile
	// starts exactly one Assignments (lag 2 - 1 running), which takes it.
	t.Run("held by a lingering run", func(t *testing.T) {
		q, c, _ := queue(t, 4)
		publish(t, q, handlertest.Assignment(t, 10))
		release := make(chan struct{})
		offered := make(chan int64, 64)
		waits := untilReleased(release, offered)
		j := job(c, waits, nil)
		setDelays(&j, 200*time.Millisecond, 0)
		j.HoldFor, j.Linger = time.Minute, 500*time.Millisecond
		done := runInBackground(context.Background(), j)
		expectOffers(t, offered, 2, 5*time.Second) // offered again: held
		publish(t, q, handlertest.Assignment(t, 11))
		var taken []int64
		started, _ := poll(t, c, 1, handlertest.AcceptFunc(func(_ context.Context, a taskassignment.Assignment) (bool, error) {
			taken = append(taken, a.Task.ID)
			return true, nil
		}), 0)
		if started != 1 || !slices.Equal(taken, []int64{11}) {
			t.Fatalf("KEDA started %d Jobs (taking %v) for a second message while a lingering run holds the first, want 1 taking [11]", started, taken)
		}
		close(release)
		r := <-done
		if r.err != nil || r.sum != (Summary{Fetched: 1, Accepted: 1}) {
			t.Fatalf("the lingering run = %+v, %v; want it to fetch the held message alone", r.sum, r.err)
		}
		close(offered)
		for id := range offered {
			if id != 10 {
				t.Fatalf("the lingering run was offered task %d while it held task 10: it fetched again", id)
			}
		}
		expectOutstanding(t, q, 0)
	})

	t.Run("handed back", func(t *testing.T) {
		q, c, _ := queue(t, 4)
		publish(t, q, handlertest.Assignment(t, 9))
		j := job(c, handlertest.AcceptFunc(func(context.Context, taskassignment.Assignment) (bool, error) { return false, nil }), nil)
		// A hold shorter than the nak delay never holds: nak and exit.
		setDelays(&j, 10*time.Second, 0)
		j.HoldFor = time.Second
		if sum, err := j.Run(context.Background()); err != nil || sum != (Summary{Fetched: 1, NotYet: 1}) {
			t.Fatalf("Run() = %+v, %v", sum, err)
		}
		if n, fetched := poll(t, c, 0, handlertest.AcceptFunc(handlertest.Never), 1); n != polls || fetched != 0 {
			t.Fatalf("KEDA started %d Jobs in %d polling intervals (fetching %d), want one each, each an empty run", n, polls, fetched)
		}
	})
}

// A held message is offered again soon at first (its executor is usually
// scheduled within a second or two, and the job's start waits for the offer
// that binds its identity), then less often, up to the decision's RetryAfter (NotYetDelay).
func TestHoldDelay(t *testing.T) {
	for _, tc := range []struct {
		offers int
		max    time.Duration
		want   time.Duration
	}{
		{0, 5 * time.Second, 250 * time.Millisecond},
		{7, 5 * time.Second, 250 * time.Millisecond},
		{8, 5 * time.Second, 500 * time.Millisecond},
		{9, 5 * time.Second, time.Second},
		{11, 5 * time.Second, 4 * time.Second},
		{12, 5 * time.Second, 5 * time.Second},
		{50, 5 * time.Second, 5 * time.Second},
		{0, 100 * time.Millisecond, 100 * time.Millisecond},
	} {
		if got := holdDelay(tc.offers, tc.max); got != tc.want {
			t.Errorf("holdDelay(%d, %v) = %v, want %v", tc.offers, tc.max, got, tc.want)
		}
	}
}

// With the default NotYetDelay (5 s), an executor scheduled right after its
// first NotYet is accepted on the next offer, long before NotYetDelay.
func TestJobOffersAHeldMessageSoonAtFirst(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	c := shortAckWait(t, env.JetStream, 30*time.Second)
	publish(t, env.Queue, handlertest.Assignment(t, 23))
	s := &script{answers: map[int64][]bool{23: {false, true}}, offered: make(chan int64, 8)}
	j := job(c, s, nil)
	setDelays(&j, handler.DefaultNotYetDelay, 0)
	j.HoldFor = time.Minute
	done := runInBackground(context.Background(), j)
	expectOffers(t, s.offered, 1, 5*time.Second)
	first := time.Now()
	expectOffers(t, s.offered, 1, handler.DefaultNotYetDelay-time.Second)
	if again := time.Since(first); again >= handler.DefaultNotYetDelay/2 {
		t.Fatalf("offered again after %v, want about %v", again, holdStep)
	}
	if r := <-done; r.err != nil || r.sum != (Summary{Fetched: 1, Accepted: 1}) {
		t.Fatalf("Run() = %+v, %v", r.sum, r.err)
	}
}
