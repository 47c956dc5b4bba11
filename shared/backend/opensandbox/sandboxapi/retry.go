package sandboxapi

import (
	"context"
	"math/rand/v2"
	"time"
)

// Retry bounds how often a request is sent again after a retryable failure
// (see Retryable). The zero value is the default policy.
type Retry struct {
	// Attempts is the most times one request is sent, the first included:
	// 1 disables retries; zero means 4.
	Attempts int
	// Initial and Max bound the wait before a retry: before attempt n+1 it
	// is a random duration up to min(Max, Initial·2^(n-1)) ("full jitter"),
	// or the server's Retry-After when that is longer, but never more than
	// Max. Zero means 200ms and 5s.
	Initial time.Duration
	Max     time.Duration
}

// MaxAttempts is the most times one request is sent, the first included.
func (r Retry) MaxAttempts() int {
	if r.Attempts <= 0 {
		return 4
	}
	return r.Attempts
}

func (r Retry) bounds() (initial, maxWait time.Duration) {
	initial, maxWait = r.Initial, r.Max
	if initial <= 0 {
		initial = 200 * time.Millisecond
	}
	if maxWait <= 0 {
		maxWait = 5 * time.Second
	}
	return initial, max(initial, maxWait)
}

// Delay is the wait after failed attempt n (1 for the first), given the
// server's Retry-After (zero when it sent none).
func (r Retry) Delay(n int, retryAfter time.Duration) time.Duration {
	initial, maxWait := r.bounds()
	ceiling := maxWait
	if n >= 1 && n < 32 {
		ceiling = min(maxWait, initial<<(n-1))
	}
	d := rand.N(ceiling + 1)
	if retryAfter > d {
		d = min(retryAfter, maxWait)
	}
	return d
}

// Sleep waits d, or until ctx is done (then it returns ctx's error).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
