package pull_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/pull"
)

// msg records how it was settled. Methods Retry does not use panic (the
// embedded nil interface).
type msg struct {
	jetstream.Msg
	delivered uint64
	mdErr     error
	fail      error

	settled string
	delay   time.Duration
	reason  string
}

func (m *msg) Metadata() (*jetstream.MsgMetadata, error) {
	if m.mdErr != nil {
		return nil, m.mdErr
	}
	return &jetstream.MsgMetadata{NumDelivered: m.delivered}, nil
}
func (m *msg) Nak() error { m.settled = "nak"; return m.fail }
func (m *msg) NakWithDelay(d time.Duration) error {
	m.settled, m.delay = "nak", d
	return m.fail
}
func (m *msg) TermWithReason(r string) error {
	m.settled, m.reason = "term", r
	return m.fail
}

func TestRetry(t *testing.T) {
	failed := errors.New("connection closed")
	for _, tc := range []struct {
		name           string
		m              *msg
		delay          time.Duration
		maxDeliver     int
		wantSettled    string
		wantDelay      time.Duration
		wantTerminated bool
		wantErr        error
	}{
		{name: "first delivery: handed back after the delay", m: &msg{delivered: 1}, delay: time.Second, maxDeliver: 5,
			wantSettled: "nak", wantDelay: time.Second},
		{name: "no delay: handed back at once", m: &msg{delivered: 2}, maxDeliver: 5, wantSettled: "nak"},
		{name: "one before the last: still handed back", m: &msg{delivered: 4}, delay: time.Second, maxDeliver: 5,
			wantSettled: "nak", wantDelay: time.Second},
		{name: "last delivery: terminated with the reason", m: &msg{delivered: 5}, delay: time.Second, maxDeliver: 5,
			wantSettled: "term", wantTerminated: true},
		{name: "past the last (a lowered MaxDeliver): terminated", m: &msg{delivered: 9}, maxDeliver: 5,
			wantSettled: "term", wantTerminated: true},
		{name: "metadata unreadable: counted as the first delivery", m: &msg{mdErr: errors.New("not a JetStream message")},
			maxDeliver: 1, wantSettled: "term", wantTerminated: true},
		{name: "metadata unreadable, limit above 1: handed back", m: &msg{mdErr: errors.New("not a JetStream message")},
			maxDeliver: 2, wantSettled: "nak"},
		{name: "no limit: handed back however often it came", m: &msg{delivered: 1e6}, wantSettled: "nak"},
		{name: "nak failed: the error says so", m: &msg{delivered: 1, fail: failed}, maxDeliver: 5,
			wantSettled: "nak", wantErr: failed},
		{name: "termination failed: the error says so", m: &msg{delivered: 5, fail: failed}, maxDeliver: 5,
			wantSettled: "term", wantTerminated: true, wantErr: failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			terminated, err := pull.Retry(tc.m, tc.delay, tc.maxDeliver, "exhausted linux-7: deliveries exhausted")
			if terminated != tc.wantTerminated || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("Retry = %v, %v; want %v, %v", terminated, err, tc.wantTerminated, tc.wantErr)
			}
			if tc.m.settled != tc.wantSettled || tc.m.delay != tc.wantDelay {
				t.Errorf("settled by %q after %v; want %q after %v", tc.m.settled, tc.m.delay, tc.wantSettled, tc.wantDelay)
			}
			if want := map[bool]string{true: "exhausted linux-7: deliveries exhausted"}[tc.wantTerminated]; tc.m.reason != want {
				t.Errorf("termination reason %q, want %q", tc.m.reason, want)
			}
		})
	}
}
