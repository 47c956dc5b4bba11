// Package assignmentsig authenticates assignment messages: dispatch and
// recover sign every assignment they publish with an Ed25519 key, and handle
// opens each message with public keys only, so that nothing able to reach the
// queue (a job's own code, say) can make handle create an executor for a task
// it chose. A handler holds no key that signs.
//
// A signed message is a JSON envelope around the exact bytes signed:
//
//	{"v":2,"kid":"<key ID>","exp":<unix seconds>,"sig":"<base64 signature>","msg":"<base64 message>"}
//
// The signature covers a domain string, the expiry and the message bytes;
// the key ID (the first 8 bytes of the public key's SHA-256, hex) only picks
// the key, so several keys can verify at once during a rotation. Open returns
// the message bytes exactly as they were signed, for the caller to decode: no
// byte of the message is trusted before its signature is.
//
// The expiry bounds replay: a copy of an assignment message (kept from the
// queue, say) opens only until exp, which the signer sets to its TTL after
// signing: the longest a task's payload lives (runnerpool.Pools.PayloadTTL),
// after which the task is over anyway. A message still queued at its expiry
// is refused like a forged one; the task it named, if still alive, is
// recover's to publish again.
package assignmentsig

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
)

// envelopeVersion is the version of the envelope Seal writes, and the only
// one Open accepts (version 1 had no expiry).
const envelopeVersion = 2

// domain separates these signatures from any other use of the key.
const domain = "gitea-dynamic-runner/assignment/v2\x00"

// MaxMessage bounds a signed message: an assignment is a few hundred bytes.
const MaxMessage = 16 << 10

// DefaultTTL is how long a sealed message opens when the signer is given no
// TTL: Gitea's default ENDLESS_TASK_TIMEOUT (3h) and an hour.
const DefaultTTL = 4 * time.Hour

// ErrUnauthenticated marks a message that is not signed, badly signed, signed
// by an unknown key, or tampered with. Its consumer terminates it: no retry
// can make it valid.
var ErrUnauthenticated = errors.New("unauthenticated assignment message")

type envelope struct {
	V   int    `json:"v"`
	KID string `json:"kid"`
	Exp int64  `json:"exp"`
	Sig []byte `json:"sig"`
	Msg []byte `json:"msg"`
}

// KeyID names a public key in an envelope.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// signed is what the signature covers: the domain, the expiry (8 bytes, big
// endian) and the message.
func signed(exp int64, msg []byte) []byte {
	b := make([]byte, 0, len(domain)+8+len(msg))
	b = append(b, domain...)
	b = binary.BigEndian.AppendUint64(b, uint64(exp))
	return append(b, msg...)
}

// Signer signs assignment messages (dispatch, recover), and opens what it
// signed itself (recover reading the queue back).
type Signer struct {
	priv ed25519.PrivateKey
	kid  string
	ring *Keyring
	ttl  time.Duration
	now  func() time.Time
}

// NewSigner returns the signer of an Ed25519 private key given as its
// 32-byte seed. Its errors never show key material.
func NewSigner(seed secretkey.Key) (*Signer, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("assignment signing key: %d bytes, want an Ed25519 seed of %d", len(seed), ed25519.SeedSize)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	pub := priv.Public().(ed25519.PublicKey)
	ring, err := NewKeyring(pub)
	if err != nil {
		return nil, err
	}
	return &Signer{priv: priv, kid: KeyID(pub), ring: ring, ttl: DefaultTTL, now: time.Now}, nil
}

// WithTTL returns a copy of s whose messages open for ttl after sealing
// (DefaultTTL if ttl is not positive).
func (s *Signer) WithTTL(ttl time.Duration) *Signer {
	c := *s
	if c.ttl = ttl; ttl <= 0 {
		c.ttl = DefaultTTL
	}
	return &c
}

// WithClock returns a copy of s that reads the time from now, to seal and
// to open (tests).
func (s *Signer) WithClock(now func() time.Time) *Signer {
	c := *s
	c.now, c.ring = now, s.ring.WithClock(now)
	return &c
}

// Public returns the public key that verifies this signer's messages.
func (s *Signer) Public() ed25519.PublicKey { return s.priv.Public().(ed25519.PublicKey) }

// Seal returns msg signed, in its envelope, opening until the signer's TTL
// from now (rounded up to the second).
func (s *Signer) Seal(msg []byte) ([]byte, error) {
	if len(msg) == 0 || len(msg) > MaxMessage {
		return nil, fmt.Errorf("seal an assignment message of %d bytes: want 1 to %d", len(msg), MaxMessage)
	}
	exp := s.now().Add(s.ttl + time.Second - 1).Unix()
	return json.Marshal(envelope{V: envelopeVersion, KID: s.kid, Exp: exp, Sig: ed25519.Sign(s.priv, signed(exp, msg)), Msg: msg})
}

// Open verifies a message against the signer's own public key.
func (s *Signer) Open(sealed []byte) ([]byte, error) { return s.ring.Open(sealed) }

// Keyring verifies signed messages with public keys only (handle, the
// Knative receiver).
type Keyring struct {
	keys map[string]ed25519.PublicKey
	now  func() time.Time
}

// NewKeyring returns the keyring of pubs; at least one, each an Ed25519
// public key.
func NewKeyring(pubs ...ed25519.PublicKey) (*Keyring, error) {
	if len(pubs) == 0 {
		return nil, errors.New("assignment verification keys: none given")
	}
	k := &Keyring{keys: make(map[string]ed25519.PublicKey, len(pubs)), now: time.Now}
	for i, pub := range pubs {
		if len(pub) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("assignment verification key %d: %d bytes, want %d", i+1, len(pub), ed25519.PublicKeySize)
		}
		k.keys[KeyID(pub)] = append(ed25519.PublicKey(nil), pub...)
	}
	return k, nil
}

// WithClock returns a copy of k that checks expiries against now (tests).
func (k *Keyring) WithClock(now func() time.Time) *Keyring {
	c := *k
	c.now = now
	return &c
}

// ParseKeyring reads a comma-separated list of base64 (standard or URL,
// padded or not) Ed25519 public keys.
func ParseKeyring(list string) (*Keyring, error) {
	var pubs []ed25519.PublicKey
	for i, field := range strings.Split(list, ",") {
		field = strings.TrimSpace(field)
		if field == "" {
			continue
		}
		pub, err := decodeBase64(field)
		if err != nil {
			return nil, fmt.Errorf("assignment verification key %d: not base64", i+1)
		}
		pubs = append(pubs, pub)
	}
	return NewKeyring(pubs...)
}

func decodeBase64(s string) ([]byte, error) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("not base64")
}

// Open verifies sealed and returns the message bytes it carries, exactly as
// signed: at most MaxMessage bytes, signed by a key of the ring, and not
// expired. Every error wraps ErrUnauthenticated and says what is wrong,
// never quoting the message.
func (k *Keyring) Open(sealed []byte) ([]byte, error) {
	msg, err := k.open(sealed)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrUnauthenticated, err)
	}
	return msg, nil
}

func (k *Keyring) open(sealed []byte) ([]byte, error) {
	if len(sealed) > 2*MaxMessage {
		return nil, fmt.Errorf("%d bytes, more than a signed assignment can be", len(sealed))
	}
	var e envelope
	dec := json.NewDecoder(bytes.NewReader(sealed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return nil, errors.New("not a signed envelope")
	}
	if dec.More() {
		return nil, errors.New("data after the signed envelope")
	}
	switch {
	case e.V != envelopeVersion:
		return nil, fmt.Errorf("envelope version %d, want %d", e.V, envelopeVersion)
	case len(e.Msg) == 0:
		return nil, errors.New("no message")
	case len(e.Msg) > MaxMessage:
		return nil, fmt.Errorf("a message of %d bytes, more than the %d a signer seals", len(e.Msg), MaxMessage)
	case len(e.Sig) != ed25519.SignatureSize:
		return nil, errors.New("no signature")
	}
	pub, ok := k.keys[e.KID]
	if !ok {
		return nil, fmt.Errorf("signed by unknown key %q", e.KID)
	}
	if !ed25519.Verify(pub, signed(e.Exp, e.Msg), e.Sig) {
		return nil, fmt.Errorf("bad signature (key %s)", e.KID)
	}
	// After the signature: an expiry nobody signed says nothing.
	if now := k.now(); now.Unix() >= e.Exp {
		return nil, fmt.Errorf("expired at %s (it is %s)", time.Unix(e.Exp, 0).UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return e.Msg, nil
}

// SigningSettings is embedded in the configuration of the functions that
// publish assignments (dispatch, recover).
type SigningSettings struct {
	SigningKey secretkey.Key `envconfig:"GDR_ASSIGNMENT_SIGNING_KEY" required:"true" desc:"base64 Ed25519 private key seed (32 bytes) that signs every published assignment; dispatch and recover"`
}

// Signer returns the signer of the configured key; its error names the
// variable, never the key.
func (s SigningSettings) Signer() (*Signer, error) {
	signer, err := NewSigner(s.SigningKey)
	if err != nil {
		return nil, fmt.Errorf("GDR_ASSIGNMENT_SIGNING_KEY: %w", err)
	}
	return signer, nil
}

// Check reports what Signer would fail on.
func (s SigningSettings) Check() error {
	_, err := s.Signer()
	return err
}

// VerifySettings is embedded in the configuration of the functions that
// take assignments (handle).
type VerifySettings struct {
	VerifyKeys string `envconfig:"GDR_ASSIGNMENT_VERIFY_KEYS" desc:"comma-separated base64 Ed25519 public keys an assignment's signature is checked with (several during a rotation); handle, required but in setup mode"`
}

// Keyring returns the keyring of the configured keys; its error names the
// variable.
func (s VerifySettings) Keyring() (*Keyring, error) {
	ring, err := ParseKeyring(s.VerifyKeys)
	if err != nil {
		return nil, fmt.Errorf("GDR_ASSIGNMENT_VERIFY_KEYS: %w", err)
	}
	return ring, nil
}
