package handler

import (
	"testing"
	"time"
)

func TestErrorBackoff(t *testing.T) {
	for _, tc := range []struct {
		base      time.Duration
		delivered uint64
		want      time.Duration
	}{
		{15 * time.Second, 0, 15 * time.Second},
		{15 * time.Second, 1, 15 * time.Second},
		{15 * time.Second, 2, 30 * time.Second},
		{15 * time.Second, 3, time.Minute},
		{15 * time.Second, 5, 4 * time.Minute},
		{15 * time.Second, 6, MaxErrorDelay},
		{15 * time.Second, 1000, MaxErrorDelay},
		{time.Hour, 1, MaxErrorDelay},
	} {
		if got := ErrorBackoff(tc.base, tc.delivered); got != tc.want {
			t.Errorf("ErrorBackoff(%v, %d) = %v, want %v", tc.base, tc.delivered, got, tc.want)
		}
	}
}
