package main

import (
	"context"
	"sync"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
)

// rounds runs dispatch rounds in the background, so a webhook or a tick is
// answered at once (Gitea gives up on a delivery after 5 s). At most one
// round per pool runs at a time; wake-ups that arrive during it coalesce into
// one more round after it. So there is never more than one goroutine per
// pool, and no wake-up is lost: a round that starts after a wake-up sees
// every task that was waiting when the wake-up came.
//
// Rounds run on the context rounds was made with; when it ends they stop
// claiming (a task already claimed is still queued, see
// dispatcher.ClaimTimeout) and no new round starts.
type rounds struct {
	ctx   context.Context
	round func(ctx context.Context, p dispatcher.Pool)

	mu     sync.Mutex
	pools  map[string]*poolRounds
	closed bool // wait was called: no round starts any more
	wg     sync.WaitGroup
}

// poolRounds is one pool's state: whether a round runs, and whether a
// wake-up came during it.
type poolRounds struct {
	running, again bool
}

func newRounds(ctx context.Context, round func(context.Context, dispatcher.Pool)) *rounds {
	return &rounds{ctx: ctx, round: round, pools: map[string]*poolRounds{}}
}

// wake asks for a round of each pool: one starts now for a pool that has
// none running, and one more follows the running round of any other.
func (r *rounds) wake(pools ...dispatcher.Pool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.ctx.Err() != nil {
		return
	}
	for _, p := range pools {
		st := r.pools[p.Name]
		if st == nil {
			st = &poolRounds{}
			r.pools[p.Name] = st
		}
		if st.running {
			st.again = true
			continue
		}
		st.running = true
		r.wg.Add(1)
		go r.run(p, st)
	}
}

// run runs rounds of p until no wake-up came during the last one. The check
// for one and the end of running happen under the lock wake takes, so a
// wake-up either is seen here or starts a round of its own.
func (r *rounds) run(p dispatcher.Pool, st *poolRounds) {
	defer r.wg.Done()
	for {
		r.round(r.ctx, p)
		r.mu.Lock()
		if !st.again || r.ctx.Err() != nil {
			st.running, st.again = false, false
			r.mu.Unlock()
			return
		}
		st.again = false
		r.mu.Unlock()
	}
}

// wait stops new rounds from starting, then waits for those in flight (and
// the one more each may owe) to end, at most timeout, and reports whether
// they did.
func (r *rounds) wait(timeout time.Duration) bool {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
