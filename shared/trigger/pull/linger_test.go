package pull

import (
	"context"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// A lingering run takes an assignment queued after its first was settled,
// which a run that does not linger leaves to the next Job; it ends once a
// wait of Linger brings nothing.
func TestJobLingerTakesTheNextAssignment(t *testing.T) {
	for _, tc := range []struct {
		name        string
		linger      time.Duration
		want        Summary
		outstanding int
	}{
		{"lingering", 800 * time.Millisecond, Summary{Fetched: 2, Accepted: 2}, 0},
		{"not lingering", 0, Summary{Fetched: 1, Accepted: 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, c, _ := queue(t, 4)
			publish(t, q, handlertest.Assignment(t, 1))
			s := &script{answers: map[int64][]bool{1: {true}, 2: {true}}, offered: make(chan int64, 4)}
			j := job(c, s, nil)
			j.Linger = tc.linger
			done := runInBackground(context.Background(), j)
			expectOffers(t, s.offered, 1, 5*time.Second)
			// Queued after the first was offered, and after the run's wait
			// for its first message would have ended.
			time.Sleep(j.Wait + 100*time.Millisecond)
			publish(t, q, handlertest.Assignment(t, 2))
			var lastOffer time.Time
			if tc.linger > 0 {
				expectOffers(t, s.offered, 1, 5*time.Second)
				lastOffer = time.Now()
			}
			r := <-done
			if r.err != nil || r.sum != tc.want {
				t.Fatalf("Run() = %+v, %v; want %+v", r.sum, r.err, tc.want)
			}
			// The server ends a pull request at 90% of its wait.
			if idle := time.Since(lastOffer); tc.linger > 0 && idle < tc.linger*8/10 {
				t.Fatalf("the run ended %v after its last offer, want after about Linger %v idle", idle, tc.linger)
			}
			expectOutstanding(t, q, tc.outstanding)
		})
	}
}

// LingerMax bounds a lingering run even while assignments keep coming: no
// wait reaches past it.
func TestJobLingerEndsAtLingerMax(t *testing.T) {
	const lingerMax = 1500 * time.Millisecond
	q, c, _ := queue(t, 4)
	s := &script{answers: map[int64][]bool{}, offered: make(chan int64, 64)}
	for id := int64(1); id <= 40; id++ {
		s.answers[id] = []bool{true}
	}
	msgs := make([]taskassignment.Assignment, 40)
	for i := range msgs {
		msgs[i] = handlertest.Assignment(t, int64(i+1))
	}
	ctx, cancel := context.WithCancel(context.Background())
	published := make(chan error, 1)
	go func() {
		defer close(published)
		for _, a := range msgs {
			if ctx.Err() != nil {
				return
			}
			if _, err := q.Publish(ctx, a); err != nil && ctx.Err() == nil {
				published <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer func() { cancel(); <-published }()
	j := job(c, s, nil)
	j.Linger, j.LingerMax = time.Hour, lingerMax
	start := time.Now()
	sum, err := j.Run(context.Background())
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-published:
		if err != nil {
			t.Fatal(err)
		}
	default:
	}
	// The fault this guards against: a run kept alive by a steady stream.
	if sum.Fetched < 3 {
		t.Fatalf("summary %+v: the run did not linger through the stream", sum)
	}
	if took < lingerMax-200*time.Millisecond || took > lingerMax+time.Second {
		t.Fatalf("the run ended after %v, want at LingerMax %v", took, lingerMax)
	}
	if sum.Accepted != sum.Fetched {
		t.Fatalf("summary %+v: every fetched assignment settled as accepted", sum)
	}
}

// A run whose first wait brings nothing ends then, lingering or not: an
// extra Assignments started by KEDA's arithmetic does not stay.
func TestJobLingerDoesNotKeepAnEmptyRun(t *testing.T) {
	_, c, _ := queue(t, 4)
	j := job(c, &script{}, nil)
	j.Linger = time.Hour
	start := time.Now()
	sum, err := j.Run(context.Background())
	if err != nil || sum != (Summary{}) {
		t.Fatalf("Run() = %+v, %v", sum, err)
	}
	if took := time.Since(start); took > j.Wait+time.Second {
		t.Fatalf("an empty run took %v, want its Wait %v", took, j.Wait)
	}
}

// On SIGTERM a lingering run stops waiting at once.
func TestJobLingerEndsOnShutdown(t *testing.T) {
	q, c, _ := queue(t, 4)
	publish(t, q, handlertest.Assignment(t, 1))
	s := &script{answers: map[int64][]bool{1: {true}}, offered: make(chan int64, 4)}
	j := job(c, s, nil)
	j.Linger = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := runInBackground(ctx, j)
	expectOffers(t, s.offered, 1, 5*time.Second)
	time.Sleep(200 * time.Millisecond) // into the lingering wait
	cancel()
	select {
	case r := <-done:
		if r.err != nil || r.sum != (Summary{Fetched: 1, Accepted: 1}) {
			t.Fatalf("Run() = %+v, %v", r.sum, r.err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a lingering run did not end on shutdown")
	}
}
