package main

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// The dispatch loop runs a round at once, then waits the idle interval; a
// round that claims a task makes the next ones come at the busy pace, and a
// kick (a webhook, a freed slot) runs one at once whatever the pace.
func TestPacedDispatchRounds(t *testing.T) {
	l := &local{log: slog.New(slog.DiscardHandler), kick: make(chan struct{}, 1),
		cadence: &dispatcher.Cadence{Idle: time.Hour, Busy: 10 * time.Millisecond, Window: time.Minute}}
	var rounds atomic.Int64
	claim := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); l.loops.Wait() }()
	l.paced(ctx, l.kick, func(context.Context) {
		rounds.Add(1)
		res := dispatcher.Result{Pool: poolName}
		select {
		case <-claim:
			res.Claimed = []taskassignment.Assignment{{}}
		default:
		}
		l.cadence.Observe(res)
	})
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
	l.kickDispatch()
	waitFor("a kick runs a round", func() bool { return rounds.Load() == 2 })
	claim <- struct{}{}
	l.kickDispatch()
	waitFor("busy rounds after a claim", func() bool { return rounds.Load() >= 10 })
}
