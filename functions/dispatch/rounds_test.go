package main

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

// Wake-ups from many goroutines, many of them while a round is ending: a
// round always starts after the last one (none is lost), and never two
// rounds of a pool at once. A lost wake-up shows only at the end of a burst,
// so there are many bursts.
func TestRoundsNeverLoseAWakeUp(t *testing.T) {
	p := dispatcher.Pool{Pool: runnerpool.Pool{Name: "linux"}}
	for burst := range 1000 {
		var wakes, seen, running, overlaps atomic.Int64
		r := newRounds(t.Context(), func(context.Context, dispatcher.Pool) {
			if running.Add(1) > 1 {
				overlaps.Add(1)
			}
			seen.Store(wakes.Load()) // rounds of one pool are serial
			running.Add(-1)
		})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 50 {
					wakes.Add(1)
					r.wake(p)
					runtime.Gosched() // let a round end between wake-ups
				}
			})
		}
		wg.Wait()
		if !r.wait(5 * time.Second) {
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
		stop func(*rounds, context.CancelFunc)
	}{
		{"waited", func(r *rounds, _ context.CancelFunc) { r.wait(time.Second) }},
		{"context ended", func(_ *rounds, cancel context.CancelFunc) { cancel() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var count atomic.Int64
			r := newRounds(ctx, func(context.Context, dispatcher.Pool) { count.Add(1) })
			tc.stop(r, cancel)
			r.wake(dispatcher.Pool{Pool: runnerpool.Pool{Name: "linux"}})
			if !r.wait(time.Second) || count.Load() != 0 {
				t.Fatalf("%d rounds after the stop", count.Load())
			}
		})
	}
}
