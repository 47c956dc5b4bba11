package assignmentsig

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
)

func signer(t testing.TB, b byte) *Signer {
	t.Helper()
	s, err := NewSigner(secretkey.Key(bytes.Repeat([]byte{b}, ed25519.SeedSize)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const message = `{"version":1,"id":"linux-7","backend":"pod","task":{"id":7,"pool":"linux"},"identity":{"repository":"alice/repo","job":"build","spiffe_id":"spiffe://ci.example.org/repo/alice/repo/task/7"}}`

// reseal rewrites the envelope of sealed with change applied.
func reseal(t *testing.T, sealed []byte, change func(*envelope)) []byte {
	t.Helper()
	var e envelope
	if err := json.Unmarshal(sealed, &e); err != nil {
		t.Fatal(err)
	}
	change(&e)
	out, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestOpen(t *testing.T) {
	current, previous, stranger := signer(t, 1), signer(t, 2), signer(t, 3)
	ring, err := NewKeyring(current.Public(), previous.Public())
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := current.Seal([]byte(message))
	if err != nil {
		t.Fatal(err)
	}
	byPrevious, _ := previous.Seal([]byte(message))
	// Sealed five hours ago with a four-hour TTL.
	expired, _ := current.WithTTL(4 * time.Hour).WithClock(func() time.Time { return time.Now().Add(-5 * time.Hour) }).Seal([]byte(message))
	byStranger, _ := stranger.Seal([]byte(message))
	other := strings.Replace(message, "alice/repo", "mallory/repo", 1)
	for _, tc := range []struct {
		name   string
		sealed []byte
		want   string // "" opens
	}{
		{"signed by the current key", sealed, ""},
		{"signed by the previous key (rotation)", byPrevious, ""},
		{"unsigned assignment", []byte(message), "not a signed envelope"},
		{"signed by a stranger", byStranger, "unknown key"},
		{"stranger claiming the current key ID", reseal(t, byStranger, func(e *envelope) { e.KID = KeyID(current.Public()) }), "bad signature"},
		{"repository changed", reseal(t, sealed, func(e *envelope) { e.Msg = []byte(other) }), "bad signature"},
		{"one byte of the message flipped", reseal(t, sealed, func(e *envelope) { e.Msg[10] ^= 1 }), "bad signature"},
		{"signature flipped", reseal(t, sealed, func(e *envelope) { e.Sig[0] ^= 1 }), "bad signature"},
		{"no signature", reseal(t, sealed, func(e *envelope) { e.Sig = nil }), "no signature"},
		{"no message", reseal(t, sealed, func(e *envelope) { e.Msg = nil }), "no message"},
		{"version 1 (no expiry)", reseal(t, sealed, func(e *envelope) { e.V = 1 }), "version 1"},
		{"expiry extended", reseal(t, sealed, func(e *envelope) { e.Exp += 3600 }), "bad signature"},
		{"expired", expired, "expired at"},
		{"inner message larger than a signer seals", reseal(t, sealed, func(e *envelope) { e.Msg = bytes.Repeat([]byte("x"), MaxMessage+1) }), "more than the 16384 a signer seals"},
		{"unknown field", []byte(strings.Replace(string(sealed), `{"v"`, `{"x":1,"v"`, 1)), "not a signed envelope"},
		{"trailing data", append(append([]byte(nil), sealed...), []byte(` {"v":1}`)...), "data after"},
		{"huge", bytes.Repeat([]byte("x"), 3*MaxMessage), "more than"},
		{"empty", nil, "not a signed envelope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, err := ring.Open(tc.sealed)
			if tc.want == "" {
				if err != nil || string(msg) != message {
					t.Fatalf("Open() = %q, %v; want the message", msg, err)
				}
				return
			}
			if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open() error = %v, want ErrUnauthenticated mentioning %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "alice") || strings.Contains(err.Error(), "mallory") {
				t.Fatalf("the error quotes the message: %v", err)
			}
		})
	}
}

func TestSignerOpensItsOwn(t *testing.T) {
	s := signer(t, 1)
	sealed, err := s.Seal([]byte(message))
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := s.Open(sealed); err != nil || string(msg) != message {
		t.Fatalf("Open(own) = %q, %v", msg, err)
	}
	if _, err := s.Open(mustSeal(t, signer(t, 2))); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("Open(another signer's) = %v", err)
	}
}

// TestExpiry: a message opens until its signer's TTL has passed, and not a
// second after; the signer's own Open checks it too.
func TestExpiry(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s := signer(t, 1).WithTTL(90 * time.Minute).WithClock(clock)
	sealed, err := s.Seal([]byte(message))
	if err != nil {
		t.Fatal(err)
	}
	ring, err := NewKeyring(s.Public())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		at    time.Duration
		opens bool
	}{{0, true}, {89 * time.Minute, true}, {90*time.Minute - time.Second, true}, {90 * time.Minute, false}, {24 * time.Hour, false}} {
		at := now.Add(tc.at)
		_, err := ring.WithClock(func() time.Time { return at }).Open(sealed)
		if (err == nil) != tc.opens {
			t.Errorf("%v after sealing: Open = %v, want opens %v", tc.at, err, tc.opens)
		}
		if err != nil && (!errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "expired at 2026-12-02T13:30:00Z")) {
			t.Errorf("%v after sealing: error %v, want ErrUnauthenticated naming the expiry", tc.at, err)
		}
	}
	later := now.Add(2 * time.Hour)
	if _, err := s.WithClock(func() time.Time { return later }).Open(sealed); err == nil {
		t.Error("the signer's own Open opened an expired message")
	}
	if d := signer(t, 1).WithTTL(0); d.ttl != DefaultTTL {
		t.Errorf("WithTTL(0) = %v, want DefaultTTL", d.ttl)
	}
}

func mustSeal(t *testing.T, s *Signer) []byte {
	t.Helper()
	b, err := s.Seal([]byte(message))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestKeys(t *testing.T) {
	if _, err := NewSigner(secretkey.Key("short")); err == nil || strings.Contains(err.Error(), "short") {
		t.Fatalf("NewSigner(short) = %v", err)
	}
	a, b := signer(t, 1), signer(t, 2)
	list := base64.StdEncoding.EncodeToString(a.Public()) + ", " + base64.RawURLEncoding.EncodeToString(b.Public())
	ring, err := ParseKeyring(list)
	if err != nil || len(ring.keys) != 2 {
		t.Fatalf("ParseKeyring(two) = %v, %v", ring, err)
	}
	for _, bad := range []string{"", " , ", "not base64!", base64.StdEncoding.EncodeToString([]byte("short"))} {
		if _, err := ParseKeyring(bad); err == nil {
			t.Errorf("ParseKeyring(%q) succeeded", bad)
		}
	}
	if _, err := a.Seal(nil); err == nil {
		t.Error("Seal(empty) succeeded")
	}
	if _, err := a.Seal(bytes.Repeat([]byte("x"), MaxMessage+1)); err == nil {
		t.Error("Seal(too large) succeeded")
	}
}

// FuzzOpen: no input opens unless it is exactly what the signer sealed, and
// no input panics.
func FuzzOpen(f *testing.F) {
	s := signer(f, 1)
	ring, _ := NewKeyring(s.Public())
	sealed, _ := s.Seal([]byte(message))
	f.Add(sealed)
	f.Add([]byte(message))
	f.Add([]byte(`{"v":2,"kid":"","exp":0,"sig":"","msg":""}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := ring.Open(data)
		if err != nil {
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("Open() error %v does not wrap ErrUnauthenticated", err)
			}
			return
		}
		var e envelope
		if json.Unmarshal(data, &e) != nil || !bytes.Equal(e.Msg, msg) || !ed25519.Verify(s.Public(), signed(e.Exp, msg), e.Sig) || time.Now().Unix() >= e.Exp {
			t.Fatalf("Open(%q) accepted a message its key did not sign", data)
		}
	})
}
