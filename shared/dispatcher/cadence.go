package dispatcher

import (
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// DefaultBusyInterval is the time between a busy pool's rounds (Cadence):
// a job fetchable while its pool is busy waits half of it on average
// instead of half of DefaultPollInterval. It costs Gitea 2.5 times the
// idle polling's CPU, only while there is work (docs/BENCHMARKS.md,
// "Pickup floor").
const DefaultBusyInterval = 200 * time.Millisecond

// DefaultBusyWindow is how long a pool stays busy after its last sign of
// work (Cadence): longer than Gitea takes to queue the jobs that need a job
// that just ended (its job emitter's queue backs off to 2 s), and than the
// gaps between the pushes of someone at work.
const DefaultBusyWindow = 30 * time.Second

// Cadence paces the rounds of each pool of a poller (dispatch serve, local
// mode): Busy between two rounds of a pool for Window after the pool's last
// sign of work, Idle otherwise. Work comes in bursts: the other jobs of a
// push, of a matrix, the jobs that need the one that just ended, the next
// push. So an idle pool costs Gitea one FetchTask per Idle (the budget,
// DefaultPollInterval), and a busy one picks the next job up within Busy.
//
// A sign of work is a round that claimed, rejected or dropped a task, a
// round that found fewer tasks in flight than the pool's previous round
// left (a task ended: the jobs that need it may be queued now), and Wake (a
// webhook about one of the pool's jobs). A failed round is no sign: a pool
// whose Gitea is unreachable never polls faster for it; with Backoff it
// polls slower and slower (Fail), and its first successful round restores
// its pace.
//
// The zero value polls every DefaultPollInterval and is never busy; Busy
// zero or not below Idle means never busy. Safe for concurrent use. Its
// memory only paces: losing it (a restart) costs at most one Window at the
// idle pace.
type Cadence struct {
	Idle, Busy, Window time.Duration
	// Backoff, when positive, caps the wait after failed rounds: from Idle
	// after the first, doubled after each next one, with a jitter of ±20%
	// (so pollers that failed together do not ask together), never above
	// Backoff. Zero: a failed round is followed at the pool's pace.
	Backoff time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time

	mu    sync.Mutex
	pools map[string]*cadencePool
}

type cadencePool struct {
	work time.Time // the last sign of work
	// left is what the last round observed left in flight (its tasks in
	// flight plus those it claimed), once observed.
	left     int
	observed bool
	// failing spaces the rounds after a failed one, from the first failure
	// to the next successful round; retry is the wait it chose last.
	failing *backoff.ExponentialBackOff
	retry   time.Duration
}

// backoffJitter and backoffFactor shape Backoff's waits.
const (
	backoffJitter = 0.2
	backoffFactor = 2
)

func (c *Cadence) now() time.Time {
	if c.Now == nil {
		return time.Now()
	}
	return c.Now()
}

func (c *Cadence) pool(name string) *cadencePool {
	if c.pools == nil {
		c.pools = map[string]*cadencePool{}
	}
	p, ok := c.pools[name]
	if !ok {
		p = &cadencePool{}
		c.pools[name] = p
	}
	return p
}

// Observe records what a successful round of res.Pool did, and reports
// whether it was a sign of work.
func (c *Cadence) Observe(res Result) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pool(res.Pool)
	ended := p.observed && res.InFlight < p.left
	work := len(res.Claimed) > 0 || res.Rejected > 0 || res.Ended > 0 || ended
	p.left, p.observed = res.InFlight+len(res.Claimed), true
	p.failing = nil
	if work {
		p.work = c.now()
	}
	return work
}

// Fail records a failed round of pool and returns the wait before its next
// round (Interval says it too, until a round succeeds). Without Backoff it
// changes nothing.
func (c *Cadence) Fail(pool string) time.Duration {
	if c.Backoff <= 0 {
		return c.Interval(pool)
	}
	c.mu.Lock()
	p := c.pool(pool)
	if p.failing == nil {
		p.failing = &backoff.ExponentialBackOff{InitialInterval: min(c.idle(), c.Backoff), RandomizationFactor: backoffJitter,
			Multiplier: backoffFactor, MaxInterval: c.Backoff}
		p.failing.Reset()
	}
	// The library caps the interval, not its jitter: the cap holds here.
	p.retry = min(p.failing.NextBackOff(), c.Backoff)
	c.mu.Unlock()
	return p.retry
}

// Wake records a sign of work for pool from outside its rounds (a webhook
// about one of its jobs).
func (c *Cadence) Wake(pool string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pool(pool).work = c.now()
}

func (c *Cadence) idle() time.Duration {
	if c.Idle <= 0 {
		return DefaultPollInterval
	}
	return c.Idle
}

// Interval is the time from the end of pool's last round to its next.
func (c *Cadence) Interval(pool string) time.Duration {
	idle := c.idle()
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.pools[pool]
	if ok && p.failing != nil {
		return p.retry
	}
	if c.Busy <= 0 || c.Busy >= idle {
		return idle
	}
	if !ok || p.work.IsZero() || c.now().Sub(p.work) >= c.Window {
		return idle
	}
	return c.Busy
}
