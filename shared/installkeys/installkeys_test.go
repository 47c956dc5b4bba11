package installkeys

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
)

// readKey decodes a written key as the functions' settings do (secretkey.Key).
func readKey(t *testing.T, p string) secretkey.Key {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.ContainsAny(data, "\n ") {
		t.Errorf("%s: whitespace in %q", p, data)
	}
	var k secretkey.Key
	if err := k.Decode(string(data)); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return k
}

// TestWriteMakesWhatTheFunctionsRead writes the keys and reads each back as its function does:
// the symmetric keys at their sizes, the signing seed as dispatch's signer, whose sealed
// message handle's keyring (from verify-keys) opens; every file 0600 in a 0700 folder.
func TestWriteMakesWhatTheFunctionsRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gdr-keys")
	written, err := Write(dir, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != len(Files) {
		t.Fatalf("wrote %v, want %v", written, Files)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("folder: %v %v, want mode 0700", fi.Mode(), err)
	}
	for _, p := range written {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v %v, want 0600", p, fi.Mode(), err)
		}
	}
	for _, c := range []struct {
		name string
		size int
	}{{BootstrapKey, 32}, {PayloadKey, 32}, {WebhookSecret, 24}, {TickToken, 32}, {AssignmentSigningKey, 32}} {
		if k := readKey(t, filepath.Join(dir, c.name)); len(k) != c.size {
			t.Errorf("%s: %d bytes, want %d", c.name, len(k), c.size)
		}
	}
	signer, err := assignmentsig.NewSigner(readKey(t, filepath.Join(dir, AssignmentSigningKey)))
	if err != nil {
		t.Fatal(err)
	}
	verify, err := os.ReadFile(filepath.Join(dir, VerifyKeys))
	if err != nil {
		t.Fatal(err)
	}
	ring, err := assignmentsig.ParseKeyring(string(verify))
	if err != nil {
		t.Fatalf("verify-keys: %v", err)
	}
	sealed, err := signer.Seal([]byte("assignment"))
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := ring.Open(sealed); err != nil || string(msg) != "assignment" {
		t.Errorf("verify-keys does not open what the signing key sealed: %q %v", msg, err)
	}
	// Another run makes other keys.
	again, err := Write(filepath.Join(t.TempDir(), "k"), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for i := range written {
		a, _ := os.ReadFile(written[i])
		b, _ := os.ReadFile(again[i])
		if bytes.Equal(a, b) {
			t.Errorf("%s: the same in two runs", Files[i])
		}
	}
}

// TestWriteRefuses checks that Write writes nothing when it cannot write everything: a file of
// Files is there (kept as it was, named in the error), or the random source fails.
func TestWriteRefuses(t *testing.T) {
	cases := []struct {
		name     string
		existing string // a file there before Write
		random   io.Reader
		want     string
		is       error
	}{
		{"payload key there", PayloadKey, rand.Reader, PayloadKey, ErrExists},
		{"verify keys there", VerifyKeys, rand.Reader, VerifyKeys, ErrExists},
		{"random source fails", "", io.LimitReader(rand.Reader, 40), "random bytes", io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.existing != "" {
				if err := os.WriteFile(filepath.Join(dir, c.existing), []byte("old"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_, err := Write(dir, c.random)
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, c.is) {
				t.Fatalf("error %v, want one naming %q (%v)", err, c.want, c.is)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 1, false: 0}[c.existing != ""]; len(entries) != want {
				t.Errorf("%d files after the refusal, want %d", len(entries), want)
			}
			if c.existing != "" {
				if data, _ := os.ReadFile(filepath.Join(dir, c.existing)); string(data) != "old" {
					t.Errorf("%s changed to %q", c.existing, data)
				}
			}
		})
	}
}
