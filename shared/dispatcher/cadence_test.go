package dispatcher

import (
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestCadence drives one pool through rounds on a fake clock and checks the
// interval before its next round after each.
func TestCadence(t *testing.T) {
	const idle, busy, window = 500 * time.Millisecond, 200 * time.Millisecond, 30 * time.Second
	claimed := func(n int) []taskassignment.Assignment { return make([]taskassignment.Assignment, n) }
	type step struct {
		after time.Duration // clock advance before the step
		round *Result       // a round observed; nil: a Wake
		work  bool          // what Observe reports
		want  time.Duration // Interval after the step
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"an idle pool stays idle", []step{
			{0, &Result{}, false, idle},
			{time.Minute, &Result{}, false, idle},
		}},
		{"a claim makes it busy for the window", []step{
			{0, &Result{}, false, idle},
			{time.Second, &Result{Claimed: claimed(1)}, true, busy},
			{window - time.Millisecond, &Result{InFlight: 1}, false, busy},
			{time.Millisecond, &Result{InFlight: 1}, false, idle},
		}},
		{"a task ended since the last round is work", []step{
			{0, &Result{InFlight: 2}, false, idle},
			{time.Second, &Result{InFlight: 1}, true, busy},
			{window, &Result{InFlight: 1}, false, idle},
		}},
		{"the first round knows no previous one", []step{
			{0, &Result{InFlight: 0}, false, idle},
		}},
		{"a task claimed last round counts as in flight", []step{
			{0, &Result{Claimed: claimed(2)}, true, busy},
			{window, &Result{InFlight: 2}, false, idle},
			{time.Second, &Result{InFlight: 1, Claimed: claimed(1)}, true, busy},
		}},
		{"rejected and dropped tasks are work", []step{
			{0, &Result{Rejected: 1}, true, busy},
			{window, &Result{}, false, idle},
			{0, &Result{Ended: 1}, true, busy},
		}},
		{"a webhook is work", []step{
			{0, &Result{}, false, idle},
			{time.Minute, nil, false, busy},
			{window, &Result{}, false, idle},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1_700_000_000, 0)
			c := &Cadence{Idle: idle, Busy: busy, Window: window, Now: func() time.Time { return now }}
			for i, s := range tt.steps {
				now = now.Add(s.after)
				if s.round == nil {
					c.Wake("p")
				} else {
					r := *s.round
					r.Pool = "p"
					if got := c.Observe(r); got != s.work {
						t.Fatalf("step %d: Observe = %v, want %v", i, got, s.work)
					}
				}
				if got := c.Interval("p"); got != s.want {
					t.Fatalf("step %d: Interval = %v, want %v", i, got, s.want)
				}
				if got := c.Interval("other"); got != idle {
					t.Fatalf("step %d: another pool's Interval = %v, want %v", i, got, idle)
				}
			}
		})
	}
}

// TestCadenceNeverBusy covers the settings that turn the busy pace off.
func TestCadenceNeverBusy(t *testing.T) {
	for _, c := range []*Cadence{
		{Idle: time.Second},
		{Idle: time.Second, Busy: time.Second, Window: time.Minute},
		{Idle: time.Second, Busy: 2 * time.Second, Window: time.Minute},
	} {
		c.Wake("p")
		c.Observe(Result{Pool: "p", Claimed: make([]taskassignment.Assignment, 1)})
		if got := c.Interval("p"); got != time.Second {
			t.Errorf("%+v: Interval = %v, want the idle 1s", c, got)
		}
	}
	var zero Cadence
	zero.Wake("p")
	if got := zero.Interval("p"); got != DefaultPollInterval {
		t.Errorf("zero Cadence: Interval = %v, want %v", got, DefaultPollInterval)
	}
}

// TestCadenceBackoff fails a busy pool's rounds in a row: each wait lies
// within ±20% of Idle doubled per failure, never above Backoff, and is what
// Interval says; another pool keeps its pace; a successful round restores
// the busy pace at once. Without Backoff, failures change nothing.
func TestCadenceBackoff(t *testing.T) {
	const idle, busy, limit = 500 * time.Millisecond, 200 * time.Millisecond, 10 * time.Second
	tests := []struct {
		name    string
		backoff time.Duration
		// want is the range of the wait after the i-th failure (from 0).
		want func(i int) (lo, hi time.Duration)
	}{
		{"backoff", limit, func(i int) (time.Duration, time.Duration) {
			d := min(idle<<i, limit)
			return d * 8 / 10, min(d*12/10, limit)
		}},
		{"none", 0, func(int) (time.Duration, time.Duration) { return busy, busy }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Cadence{Idle: idle, Busy: busy, Window: time.Hour, Backoff: tt.backoff}
			c.Observe(Result{Pool: "p", Claimed: make([]taskassignment.Assignment, 1)})
			var waits []time.Duration
			for i := range 12 {
				got := c.Fail("p")
				waits = append(waits, got)
				if lo, hi := tt.want(i); got < lo || got > hi {
					t.Fatalf("failure %d: wait %v, want within [%v, %v]; waits %v", i+1, got, lo, hi, waits)
				}
				if in := c.Interval("p"); in != got {
					t.Fatalf("failure %d: Interval %v, Fail said %v", i+1, in, got)
				}
				if other := c.Interval("other"); other != idle {
					t.Fatalf("another pool's Interval = %v, want %v", other, idle)
				}
			}
			t.Logf("waits: %v", waits)
			c.Observe(Result{Pool: "p", InFlight: 1})
			if got := c.Interval("p"); got != busy {
				t.Fatalf("after a successful round: Interval %v, want the busy %v", got, busy)
			}
		})
	}
}
