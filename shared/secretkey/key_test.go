package secretkey

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	raw := bytes.Repeat([]byte{0xfb, 0xff, 0x01}, 11) // 33 bytes, with base64 '+', '/', '-' and '_' forms
	for _, form := range []string{
		"+/8B+/8B+/8B+/8B+/8B+/8B+/8B+/8B+/8B+/8B+/8B",
		"-_8B-_8B-_8B-_8B-_8B-_8B-_8B-_8B-_8B-_8B-_8B",
		"  +/8B+/8B+/8B+/8B+/8B+/8B+/8B+/8B+/8B+/8B+/8B\n",
	} {
		var k Key
		if err := k.Decode(form); err != nil {
			t.Fatalf("Decode(%q): %v", form, err)
		}
		if !bytes.Equal(k, raw) {
			t.Fatalf("Decode(%q) = %x, want %x", form, []byte(k), raw)
		}
	}
	var k Key
	err := k.Decode("not base64 at all: s3cr3t!")
	if err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("Decode of garbage: err = %v", err)
	}
}

func TestAtLeast(t *testing.T) {
	if err := Key(make([]byte, 31)).AtLeast("X_KEY", 32); err == nil || !strings.Contains(err.Error(), "X_KEY") {
		t.Fatalf("31 bytes: %v", err)
	}
	if err := Key(make([]byte, 32)).AtLeast("X_KEY", 32); err != nil {
		t.Fatalf("32 bytes: %v", err)
	}
}

func TestNeverPrints(t *testing.T) {
	k := Key("super-secret-material-0123456789")
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "key", k, "cfg", struct{ K Key }{k})
	js, err := json.Marshal(struct{ K Key }{k})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		fmt.Sprint(k), fmt.Sprintf("%v %+v %#v %s %q %x %X", k, k, k, k, k, k, k),
		fmt.Sprintf("%+v", struct{ K Key }{k}), string(js), logged.String(),
	} {
		if strings.Contains(s, "super-secret") || strings.Contains(strings.ToLower(s), fmt.Sprintf("%x", []byte("super"))) {
			t.Fatalf("key leaked: %s", s)
		}
		if !strings.Contains(s, redacted) {
			t.Fatalf("no placeholder in %q", s)
		}
	}
}
