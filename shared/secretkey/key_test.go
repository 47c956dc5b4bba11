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

// TestKeys: a rotation's list of keys decodes entry by entry, skips empty entries, and names the
// position of a bad one, never its value; a length check names the variable and the position.
func TestKeys(t *testing.T) {
	a, b := "YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE=", "YmJiYg" // 32 bytes "a", 4 bytes "b" (unpadded)
	for _, tc := range []struct {
		name    string
		value   string
		want    []int // the decoded keys' lengths
		wantErr string
	}{
		{"empty", "", nil, ""},
		{"blank entries only", " , ,", nil, ""},
		{"one", a, []int{32}, ""},
		{"two, spaces and a trailing comma", " " + a + " ,\n" + b + ",", []int{32, 4}, ""},
		{"second not base64", a + ",s3cr3t!!", nil, "key 2 is not valid base64"},
		{"first not base64, a blank before it", ", s3cr3t!!," + a, nil, "key 1 is not valid base64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ks Keys
			err := ks.Decode(tc.value)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "s3cr3t") {
					t.Fatalf("Decode(%q) = %v, want an error with %q and no value", tc.value, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode(%q): %v", tc.value, err)
			}
			var got []int
			for _, k := range ks {
				got = append(got, len(k))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("Decode(%q): lengths %v, want %v", tc.value, got, tc.want)
			}
		})
	}
	ks := Keys{make([]byte, 32), make([]byte, 31), make([]byte, 33)}
	if err := ks.AtLeast("X_OLD_KEYS", 32); err == nil || !strings.Contains(err.Error(), "X_OLD_KEYS: key 2 has 31 bytes, need at least 32") || strings.Contains(err.Error(), "key 3") {
		t.Fatalf("AtLeast: %v", err)
	}
	if err := ks.Exactly("X_OLD_KEYS", 32); err == nil || !strings.Contains(err.Error(), "X_OLD_KEYS: key 2 has 31 bytes, need exactly 32") || !strings.Contains(err.Error(), "X_OLD_KEYS: key 3 has 33 bytes") {
		t.Fatalf("Exactly: %v", err)
	}
	if err := (Keys{make([]byte, 32)}).Exactly("X_OLD_KEYS", 32); err != nil {
		t.Fatalf("Exactly of a good list: %v", err)
	}
	if err := Keys(nil).AtLeast("X_OLD_KEYS", 32); err != nil {
		t.Fatalf("AtLeast of no key: %v", err)
	}
}

func TestKeysNeverPrint(t *testing.T) {
	ks := Keys{Key("super-secret-material-0123456789"), Key("super-secret-material-abcdefghij")}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "keys", ks, "cfg", struct{ K Keys }{ks})
	js, err := json.Marshal(struct{ K Keys }{ks})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		fmt.Sprint(ks), fmt.Sprintf("%v %+v %#v %s %q %x", ks, ks, ks, ks, ks, ks),
		fmt.Sprintf("%+v", struct{ K Keys }{ks}), string(js), logged.String(),
	} {
		if strings.Contains(s, "super-secret") || strings.Contains(strings.ToLower(s), fmt.Sprintf("%x", []byte("super"))) {
			t.Fatalf("key leaked: %s", s)
		}
		if !strings.Contains(s, redacted) {
			t.Fatalf("no placeholder in %q", s)
		}
	}
}
