// Package secretkey holds symmetric keys read from configuration.
//
// A Key never prints: every fmt verb, slog and JSON render it as a fixed
// placeholder, so a configuration struct that holds one can be logged whole
// without leaking it. Keys, a rotation's list of old keys, never prints
// either.
package secretkey

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

const redacted = "[redacted]"

// Key is secret key material.
type Key []byte

// Decode reads a key from its configured form, base64 (standard or URL-safe,
// padded or not). It implements envconfig.Decoder. Errors never echo the value.
func (k *Key) Decode(value string) error {
	value = strings.TrimSpace(value)
	if value == "" {
		*k = nil
		return nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(value); err == nil {
			*k = b
			return nil
		}
	}
	return errors.New("secret key is not valid base64")
}

// AtLeast returns an error naming what (a configuration variable) if the key
// is shorter than n bytes.
func (k Key) AtLeast(what string, n int) error {
	if len(k) < n {
		return fmt.Errorf("%s: key has %d bytes, need at least %d (for example: head -c %d /dev/urandom | base64)", what, len(k), n, n)
	}
	return nil
}

// Format prints a placeholder for every verb.
func (k Key) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted)) }

// LogValue keeps the key out of structured logs.
func (k Key) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText keeps the key out of JSON and other text encodings.
func (k Key) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Keys is a list of keys read from configuration: a rotation's old keys, which a
// value may still be sealed or signed with. Like a Key it never prints.
type Keys []Key

// Decode reads a comma-separated list, each entry as Key.Decode reads one; empty
// entries are skipped. It implements envconfig.Decoder. An error names the
// entry's position among the keys listed (1 is the first), never a value.
func (ks *Keys) Decode(value string) error {
	var out Keys
	for _, field := range strings.Split(value, ",") {
		if strings.TrimSpace(field) == "" {
			continue
		}
		var k Key
		if err := k.Decode(field); err != nil {
			return fmt.Errorf("key %d is not valid base64", len(out)+1)
		}
		out = append(out, k)
	}
	*ks = out
	return nil
}

// AtLeast returns an error naming what (a configuration variable) and the
// position (1 is the first) of each key shorter than n bytes.
func (ks Keys) AtLeast(what string, n int) error {
	var errs []error
	for i, k := range ks {
		if len(k) < n {
			errs = append(errs, fmt.Errorf("%s: key %d has %d bytes, need at least %d", what, i+1, len(k), n))
		}
	}
	return errors.Join(errs...)
}

// Exactly returns an error naming what (a configuration variable) and the
// position (1 is the first) of each key that is not exactly n bytes.
func (ks Keys) Exactly(what string, n int) error {
	var errs []error
	for i, k := range ks {
		if len(k) != n {
			errs = append(errs, fmt.Errorf("%s: key %d has %d bytes, need exactly %d", what, i+1, len(k), n))
		}
	}
	return errors.Join(errs...)
}

// Format prints a placeholder for every verb.
func (ks Keys) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted)) }

// LogValue keeps the keys out of structured logs.
func (ks Keys) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText keeps the keys out of JSON and other text encodings.
func (ks Keys) MarshalText() ([]byte, error) { return []byte(redacted), nil }
