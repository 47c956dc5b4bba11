// Package secretkey holds symmetric keys read from configuration.
//
// A Key never prints: every fmt verb, slog and JSON render it as a fixed
// placeholder, so a configuration struct that holds one can be logged whole
// without leaking it.
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
