package dispatcher

import (
	"context"
	"sync"
	"time"
)

// Rounds runs the rounds of a poller's pools in the background (dispatch
// serve, local mode), so that whatever asks for one (a webhook, a tick, a
// freed slot, the poll) is answered at once. At most one round of a pool
// runs at a time; wake-ups that arrive during it coalesce into one more
// round after it. So there is never more than one goroutine per pool, and
// no wake-up is lost: a round that starts after a wake-up sees every task
// that was waiting when the wake-up came.
//
// With a Cadence, Poll also wakes each pool on its own: a round follows the
// end of the pool's last one, whatever started that round, after the
// cadence's interval, so no poll comes right after a webhook's round.
//
// Rounds run on the context NewRounds was given; when it ends they stop
// claiming (a task already claimed is still queued, see ClaimTimeout) and no
// new round starts.
type Rounds struct {
	ctx     context.Context
	round   func(ctx context.Context, p Pool) (Result, error)
	cadence *Cadence

	mu     sync.Mutex
	pools  map[string]*poolRounds
	closed bool // Wait was called: no round starts any more
	wg     sync.WaitGroup
}

// poolRounds is one pool's state: whether a round runs, whether a wake-up
// came during it, and the signal of a round's end to the pool's poll loop.
type poolRounds struct {
	running, again bool
	ended          chan struct{} // holds at most one signal: a loop needs only the last end
}

// NewRounds returns the rounds of round, run on ctx. cadence, when not nil,
// sees every round's outcome (Observe, or Fail for a failed one) before the
// pool's poll loop hears that the round ended, so the next wait is paced by
// that round.
func NewRounds(ctx context.Context, round func(context.Context, Pool) (Result, error), cadence *Cadence) *Rounds {
	return &Rounds{ctx: ctx, round: round, cadence: cadence, pools: map[string]*poolRounds{}}
}

// state returns the state of pool name; r.mu must be held.
func (r *Rounds) state(name string) *poolRounds {
	st := r.pools[name]
	if st == nil {
		st = &poolRounds{ended: make(chan struct{}, 1)}
		r.pools[name] = st
	}
	return st
}

// Wake asks for a round of each pool: one starts now for a pool that has
// none running, and one more follows the running round of any other.
func (r *Rounds) Wake(pools ...Pool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.ctx.Err() != nil {
		return
	}
	for _, p := range pools {
		st := r.state(p.Name)
		if st.running {
			st.again = true
			continue
		}
		st.running = true
		r.wg.Add(1)
		go r.run(p, st)
	}
}

// Work is Wake for pools that have a sign of work outside a round (a
// webhook naming one of their jobs): with a cadence, each is busy from now
// (Cadence.Wake), so the rounds after this one come at the busy pace.
func (r *Rounds) Work(pools ...Pool) {
	if r.cadence != nil {
		for _, p := range pools {
			r.cadence.Wake(p.Name)
		}
	}
	r.Wake(pools...)
}

// run runs rounds of p until no wake-up came during the last one. The check
// for one and the end of running happen under the lock Wake takes, so a
// wake-up either is seen here or starts a round of its own.
func (r *Rounds) run(p Pool, st *poolRounds) {
	defer r.wg.Done()
	for {
		res, err := r.round(r.ctx, p)
		switch {
		case r.cadence == nil:
		case err == nil:
			r.cadence.Observe(res)
		case r.ctx.Err() == nil:
			r.cadence.Fail(p.Name)
		}
		select {
		case st.ended <- struct{}{}:
		default: // the loop has one to read already
		}
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

// Poll wakes a round of each pool at once, then again each time the
// cadence's interval has passed since the end of the pool's last round,
// until ctx ends; it returns then. Without a cadence it returns at once:
// the pools are woken by their callers only.
func (r *Rounds) Poll(ctx context.Context, pools ...Pool) {
	if r.cadence == nil {
		return
	}
	var loops sync.WaitGroup
	for _, p := range pools {
		r.mu.Lock()
		ended := r.state(p.Name).ended
		r.mu.Unlock()
		loops.Go(func() { r.poll(ctx, p, ended) })
	}
	loops.Wait()
}

func (r *Rounds) poll(ctx context.Context, p Pool, ended <-chan struct{}) {
	t := time.NewTimer(0) // the first round at once
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Wake(p) // its end starts the next wait
		case <-ended:
			t.Reset(r.cadence.Interval(p.Name))
		}
	}
}

// Wait stops new rounds from starting, then waits for those in flight (and
// the one more each may owe) to end, at most timeout, and reports whether
// they did.
func (r *Rounds) Wait(timeout time.Duration) bool {
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
