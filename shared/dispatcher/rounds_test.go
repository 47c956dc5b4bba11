package dispatcher_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Wake-ups from many goroutines, many of them while a round is ending: a
// round always starts after the last one (none is lost), and never two
// rounds of a pool at once. A lost wake-up shows only at the end of a burst,
// so there are many bursts.
func TestRoundsNeverLoseAWakeUp(t *testing.T) {
	p := dispatcher.Pool{Pool: runnerpool.Pool{Name: "linux"}}
	for burst := range 1000 {
		var wakes, seen, running, overlaps atomic.Int64
		r := dispatcher.NewRounds(t.Context(), func(context.Context, dispatcher.Pool) (dispatcher.Result, error) {
			if running.Add(1) > 1 {
				overlaps.Add(1)
			}
			seen.Store(wakes.Load()) // rounds of one pool are serial
			running.Add(-1)
			return dispatcher.Result{}, nil
		}, nil)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 50 {
					wakes.Add(1)
					r.Wake(p)
					runtime.Gosched() // let a round end between wake-ups
				}
			})
		}
		wg.Wait()
		if !r.Wait(5 * time.Second) {
			t.Fatalf("burst %d: rounds still running 5 s after the last wake-up", burst)
		}
		if seen.Load() != wakes.Load() {
			t.Fatalf("burst %d: the last round started after %d of %d wake-ups: a wake-up was lost", burst, seen.Load(), wakes.Load())
		}
		if overlaps.Load() != 0 {
			t.Fatalf("burst %d: %d rounds of one pool overlapped", burst, overlaps.Load())
		}
	}
}

// After wait, and after the context ends, no round starts.
func TestRoundsStop(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(*dispatcher.Rounds, context.CancelFunc)
	}{
		{"waited", func(r *dispatcher.Rounds, _ context.CancelFunc) { r.Wait(time.Second) }},
		{"context ended", func(_ *dispatcher.Rounds, cancel context.CancelFunc) { cancel() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var count atomic.Int64
			r := dispatcher.NewRounds(ctx, func(context.Context, dispatcher.Pool) (dispatcher.Result, error) {
				count.Add(1)
				return dispatcher.Result{}, nil
			}, nil)
			tc.stop(r, cancel)
			r.Wake(dispatcher.Pool{Pool: runnerpool.Pool{Name: "linux"}})
			if !r.Wait(time.Second) || count.Load() != 0 {
				t.Fatalf("%d rounds after the stop", count.Load())
			}
		})
	}
}

// Poll runs a round at once, then waits the idle interval; a round that
// claims a task makes the next ones come at the busy pace, and a Wake (a
// webhook, a freed slot) runs one at once whatever the pace. A failed round
// is no sign of work.
func TestRoundsPolledAtTheCadencesPace(t *testing.T) {
	p := dispatcher.Pool{Pool: runnerpool.Pool{Name: "linux"}}
	cadence := &dispatcher.Cadence{Idle: time.Hour, Busy: 10 * time.Millisecond, Window: time.Minute}
	var rounds atomic.Int64
	claim, fail := make(chan struct{}, 1), make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(t.Context())
	r := dispatcher.NewRounds(ctx, func(context.Context, dispatcher.Pool) (dispatcher.Result, error) {
		rounds.Add(1)
		res := dispatcher.Result{Pool: p.Name}
		select {
		case <-fail:
			// A failed round that would have claimed: the cadence must not see it.
			return dispatcher.Result{Pool: p.Name, Claimed: []taskassignment.Assignment{{}}}, errors.New("gitea unreachable")
		case <-claim:
			res.Claimed = []taskassignment.Assignment{{}}
		default:
		}
		return res, nil
	}, cadence)
	pollUntilTheEnd(t, ctx, cancel, r, p)
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d rounds", what, rounds.Load())
			}
		}
	}
	waitFor("the first round at once", func() bool { return rounds.Load() == 1 })
	time.Sleep(100 * time.Millisecond)
	if n := rounds.Load(); n != 1 {
		t.Fatalf("%d rounds within 0.1 s of an idle start, want 1 (idle pace: 1 h)", n)
	}
	fail <- struct{}{}
	r.Wake(p)
	waitFor("a wake-up runs a round", func() bool { return rounds.Load() == 2 })
	time.Sleep(100 * time.Millisecond)
	if n := rounds.Load(); n != 2 {
		t.Fatalf("%d rounds within 0.1 s of a failed round, want 2: a failed round is no sign of work", n)
	}
	claim <- struct{}{}
	r.Wake(p)
	waitFor("busy rounds after a claim", func() bool { return rounds.Load() >= 12 })
}

// Work (a webhook about one of the pool's jobs) runs a round now and makes
// an idle pool busy: the rounds after it come at the busy pace, with no
// round of its own having claimed anything.
func TestRoundsWorkMakesThePoolBusy(t *testing.T) {
	p := dispatcher.Pool{Pool: runnerpool.Pool{Name: "linux"}}
	var rounds atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	r := dispatcher.NewRounds(ctx, func(context.Context, dispatcher.Pool) (dispatcher.Result, error) {
		rounds.Add(1)
		return dispatcher.Result{Pool: p.Name}, nil // never a sign of work by itself
	}, &dispatcher.Cadence{Idle: time.Hour, Busy: 10 * time.Millisecond, Window: time.Minute})
	pollUntilTheEnd(t, ctx, cancel, r, p)
	for deadline := time.Now().Add(5 * time.Second); rounds.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no first round")
		}
	}
	time.Sleep(100 * time.Millisecond)
	if n := rounds.Load(); n != 1 {
		t.Fatalf("%d rounds within 0.1 s of an idle start, want 1", n)
	}
	r.Work(p)
	for deadline := time.Now().Add(5 * time.Second); rounds.Load() < 12; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d rounds 5 s after Work; want the busy pace (every 10 ms)", rounds.Load())
		}
	}
}

// Without a cadence Poll returns at once and runs no round.
func TestRoundsWithoutCadenceNeverPoll(t *testing.T) {
	var rounds atomic.Int64
	r := dispatcher.NewRounds(t.Context(), func(context.Context, dispatcher.Pool) (dispatcher.Result, error) {
		rounds.Add(1)
		return dispatcher.Result{}, nil
	}, nil)
	r.Poll(t.Context(), dispatcher.Pool{Pool: runnerpool.Pool{Name: "linux"}})
	if !r.Wait(time.Second) || rounds.Load() != 0 {
		t.Fatalf("%d rounds without a cadence, want 0", rounds.Load())
	}
}

// While rounds fail, a cadence with Backoff spaces them out (Fail); the
// first round that succeeds restores the pool's pace.
func TestRoundsBackOffWhileRoundsFail(t *testing.T) {
	p := dispatcher.Pool{Pool: runnerpool.Pool{Name: "linux"}}
	const idle = 20 * time.Millisecond
	cadence := &dispatcher.Cadence{Idle: idle, Backoff: 400 * time.Millisecond}
	var rounds atomic.Int64
	var failing atomic.Bool
	failing.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	r := dispatcher.NewRounds(ctx, func(context.Context, dispatcher.Pool) (dispatcher.Result, error) {
		rounds.Add(1)
		if failing.Load() {
			return dispatcher.Result{}, errors.New("gitea unreachable")
		}
		return dispatcher.Result{Pool: p.Name}, nil
	}, cadence)
	pollUntilTheEnd(t, ctx, cancel, r, p)
	// 2 s at 20 ms would be 100 rounds; backing off (20, 40, 80, 160, 320,
	// then 400 ms, ±20%) it is about 9.
	time.Sleep(2 * time.Second)
	failed := rounds.Load()
	if failed < 4 || failed > 14 {
		t.Fatalf("%d rounds in 2 s of failures, want about 9 (backing off to 400 ms)", failed)
	}
	failing.Store(false)
	time.Sleep(600 * time.Millisecond) // the last wait (at most 400 ms), then the idle pace
	if n := rounds.Load() - failed; n < 5 {
		t.Fatalf("%d rounds in the 0.6 s after rounds succeed again, want the idle pace (20 ms)", n)
	}
	t.Logf("%d rounds in 2 s of failures, then %d in 0.6 s", failed, rounds.Load()-failed)
}

// pollUntilTheEnd runs r.Poll(ctx, p) until the test ends, then ends ctx
// (cancel) and waits for the poll and the rounds to stop.
func pollUntilTheEnd(t *testing.T, ctx context.Context, cancel context.CancelFunc, r *dispatcher.Rounds, p dispatcher.Pool) {
	polled := make(chan struct{})
	go func() { r.Poll(ctx, p); close(polled) }()
	t.Cleanup(func() {
		cancel()
		<-polled
		r.Wait(5 * time.Second)
	})
}
