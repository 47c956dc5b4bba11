// Package installkeys makes the keys and secrets of a cluster install (deploy/README.md, install
// step 1) as files, in the forms the functions read them: base64 of random bytes for
// the symmetric keys and tokens (secretkey.Key), the Ed25519 seed that signs assignments
// (assignmentsig.NewSigner) and its public key as the verification list
// (assignmentsig.ParseKeyring).
//
// Invariants: every file is created with mode 0600 in a folder of mode 0700, never over an
// existing file (a new payload key makes the stored payloads unreadable, a new signing key
// makes handle refuse what is queued), and no key material reaches an error.
package installkeys

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// The files Write creates, named as deploy/README.md's kubectl commands read them (the keys of
// the gdr-secrets Secret and of the gdr-assignment-verify-keys ConfigMap).
const (
	BootstrapKey         = "bootstrap-key"
	PayloadKey           = "payload-key"
	WebhookSecret        = "webhook-secret"
	TickToken            = "tick-token"
	AssignmentSigningKey = "assignment-signing-key"
	// VerifyKeys is public: the base64 Ed25519 public key of AssignmentSigningKey.
	VerifyKeys = "verify-keys"
)

// sizes are the random bytes of each symmetric key or token.
var sizes = []struct {
	name string
	n    int
}{
	{BootstrapKey, 32}, {PayloadKey, 32}, {WebhookSecret, 24}, {TickToken, 32},
}

// Files are the names of every file Write creates, in the order it writes them.
var Files = []string{BootstrapKey, PayloadKey, WebhookSecret, TickToken, AssignmentSigningKey, VerifyKeys}

// ErrExists is returned (wrapped, naming the file) when a file Write would create is there.
var ErrExists = errors.New("already exists")

// Write creates dir (mode 0700) if it is missing and writes every file of Files into it, the
// keys read from random (crypto/rand.Reader outside tests). It writes nothing when any of the
// files exists: the error names it. It returns the paths written.
func Write(dir string, random io.Reader) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("key folder %s: %w", dir, err)
	}
	for _, name := range Files {
		p := filepath.Join(dir, name)
		if _, err := os.Lstat(p); err == nil {
			return nil, fmt.Errorf("%s: %w (a key in use is not replaced by hand: it rotates as docs/OPERATIONS.md, \"Rotating secrets\", says)", p, ErrExists)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	contents, err := Generate(random)
	if err != nil {
		return nil, err
	}
	var written []string
	for _, name := range Files {
		p := filepath.Join(dir, name)
		if err := create(p, contents[name]); err != nil {
			return written, err
		}
		written = append(written, p)
	}
	return written, nil
}

// Generate returns the contents of every file of Files, the keys read from random.
func Generate(random io.Reader) (map[string][]byte, error) {
	contents := make(map[string][]byte, len(Files))
	for _, s := range sizes {
		b, err := read(random, s.n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		contents[s.name] = encode(b)
	}
	seed, err := read(random, ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", AssignmentSigningKey, err)
	}
	contents[AssignmentSigningKey] = encode(seed)
	verify, err := VerifyKeyOf(contents[AssignmentSigningKey])
	if err != nil {
		return nil, err
	}
	contents[VerifyKeys] = verify
	return contents, nil
}

// VerifyKeyOf returns the verification key (VerifyKeys' form) of a signing key in
// AssignmentSigningKey's form. Its errors hold no key material.
func VerifyKeyOf(signingKey []byte) ([]byte, error) {
	seed, err := base64.StdEncoding.DecodeString(string(signingKey))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%s: not the base64 of a %d-byte Ed25519 seed", AssignmentSigningKey, ed25519.SeedSize)
	}
	return encode(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)), nil
}

// read returns n bytes of random.
func read(random io.Reader, n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(random, b); err != nil {
		return nil, fmt.Errorf("random bytes: %w", err)
	}
	return b, nil
}

// encode is standard base64 without a newline: kubectl --from-file takes the file as it is.
func encode(b []byte) []byte {
	return []byte(base64.StdEncoding.EncodeToString(b))
}

// create writes data to a new file p, mode 0600, and fails if p exists.
func create(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("%s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}
