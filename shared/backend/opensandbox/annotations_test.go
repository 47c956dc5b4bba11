package opensandbox_test

import (
	"errors"
	"maps"
	"regexp"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
)

const prefix = "ci.example.org"

// labelValue is the server's rule for a metadata value, as its
// documentation states it.
var labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)

func checkLabelValues(t *testing.T, md map[string]string) {
	t.Helper()
	for k, v := range md {
		if len(v) > 63 || !labelValue.MatchString(v) {
			t.Fatalf("metadata %s = %q is not a label value", k, v)
		}
	}
}

func TestAnnotationsRoundTrip(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		wantChunks  int
	}{
		{"identity", map[string]string{
			prefix + "/repository": "Alice/Repo.Name",
			prefix + "/job-key":    "build:linux/amd64",
			prefix + "/spiffe-id":  "spiffe://ci.example.org/repo/alice/repo.name/task/9223372036854775807",
			prefix + "/image":      "registry.example.org:5000/team/image@sha256:0123456789abcdef",
		}, 0},
		{"empty", map[string]string{}, 1},
		{"nil", nil, 1},
		{"characters JSON escapes", map[string]string{"k": `<&>"\` + "\n\t\u2028 é 日本"}, 0},
		// {"k":"…"} is 8 bytes plus the value; 47 bytes take 63 characters.
		{"exactly one full chunk", map[string]string{"k": strings.Repeat("x", 39)}, 1},
		{"one character more", map[string]string{"k": strings.Repeat("x", 40)}, 2},
		{"long", map[string]string{"k": strings.Repeat("ab/", 2000)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md, err := opensandbox.EncodeAnnotations(prefix, tt.annotations)
			if err != nil {
				t.Fatal(err)
			}
			checkLabelValues(t, md)
			if tt.wantChunks > 0 && len(md) != tt.wantChunks {
				t.Fatalf("%d chunks, want %d", len(md), tt.wantChunks)
			}
			for k := range md {
				if !strings.HasPrefix(k, prefix+"/annotations-") || len(k) != len(prefix+"/annotations-000") {
					t.Fatalf("chunk key %q", k)
				}
			}
			again, err := opensandbox.EncodeAnnotations(prefix, maps.Clone(tt.annotations))
			if err != nil || !maps.Equal(md, again) {
				t.Fatal("the encoding is not deterministic")
			}
			// Other keys, such as labels and keys someone else set, are
			// ignored.
			withLabels := maps.Clone(md)
			withLabels[prefix+"/assignment-id"] = "linux-42"
			withLabels["other.io/annotations-000"] = "x"
			withLabels[prefix+"/annotations"] = "x"
			got, err := opensandbox.DecodeAnnotations(prefix, withLabels)
			if err != nil {
				t.Fatal(err)
			}
			want := tt.annotations
			if want == nil {
				want = map[string]string{}
			}
			if !maps.Equal(got, want) {
				t.Fatalf("decoded %q, want %q", got, want)
			}
		})
	}
}

func TestDecodeAnnotationsRefusesBrokenChunks(t *testing.T) {
	good, err := opensandbox.EncodeAnnotations(prefix, map[string]string{
		prefix + "/repository": "alice/repo",
		prefix + "/job-key":    "build",
		prefix + "/spiffe-id":  "spiffe://ci.example.org/repo/alice/repo/task/42",
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(good) < 3 {
		t.Fatalf("want at least 3 chunks for these cases, got %d", len(good))
	}
	key := func(i string) string { return prefix + "/annotations-" + i }
	tests := []struct {
		name string
		edit func(md map[string]string)
	}{
		{"no chunk at all", func(md map[string]string) { clear(md) }},
		{"first missing", func(md map[string]string) { delete(md, key("000")) }},
		{"middle missing", func(md map[string]string) { delete(md, key("001")) }},
		{"last missing", func(md map[string]string) { delete(md, key(lastIndex(md))) }},
		{"extra chunk after a gap", func(md map[string]string) { md[key("050")] = "AAAA" }},
		{"extra chunk right after the last", func(md map[string]string) { md[key(nextIndex(md))] = "AAAA" }},
		{"chunks swapped", func(md map[string]string) { md[key("000")], md[key("001")] = md[key("001")], md[key("000")] }},
		{"last chunk moved first", func(md map[string]string) {
			last := key(lastIndex(md))
			md[key("000")], md[last] = md[last], md[key("000")]
		}},
		{"index not three digits", func(md map[string]string) { md[key("1")] = md[key("001")]; delete(md, key("001")) }},
		{"index of four digits", func(md map[string]string) { md[key("0001")] = md[key("001")]; delete(md, key("001")) }},
		{"index not a number", func(md map[string]string) { md[key("00a")] = "x" }},
		{"signed index", func(md map[string]string) { md[key("+01")] = md[key("001")]; delete(md, key("001")) }},
		{"short middle chunk", func(md map[string]string) { md[key("001")] = md[key("001")][:10] }},
		{"empty last chunk", func(md map[string]string) { md[key(nextIndex(md))] = "" }},
		{"not base64", func(md map[string]string) { md[key("001")] = md[key("001")][:30] + "." + md[key("001")][31:] }},
		{"flipped character", func(md map[string]string) { md[key("000")] = "f" + md[key("000")][1:] }},
		{"standard base64", func(md map[string]string) { md[key("001")] = md[key("001")][:30] + "+" + md[key("001")][31:] }},
		{"base64 of not JSON", func(md map[string]string) { clear(md); md[key("000")] = "bm90IGpzb24" }},            // "not json"
		{"JSON array", func(md map[string]string) { clear(md); md[key("000")] = "WyJhIl0" }},                        // ["a"]
		{"JSON number value", func(md map[string]string) { clear(md); md[key("000")] = "eyJhIjoxfQ" }},              // {"a":1}
		{"JSON null", func(md map[string]string) { clear(md); md[key("000")] = "bnVsbA" }},                          // null
		{"keys out of order", func(md map[string]string) { clear(md); md[key("000")] = "eyJiIjoiMSIsImEiOiIyIn0" }}, // {"b":"1","a":"2"}
		{"JSON with spaces", func(md map[string]string) { clear(md); md[key("000")] = "eyAiYSI6ICIxIiB9" }},         // { "a": "1" }
		{"padding", func(md map[string]string) { clear(md); md[key("000")] = "eyJhIjoiMSJ9" + "==" }},               // {"a":"1"}==
		{"trailing JSON", func(md map[string]string) { clear(md); md[key("000")] = "eyJhIjoiMSJ9e30" }},             // {"a":"1"}{}
		{"non-canonical trailing bits", func(md map[string]string) { clear(md); md[key("000")] = "e31" }},           // {} is e30
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md := maps.Clone(good)
			tt.edit(md)
			got, err := opensandbox.DecodeAnnotations(prefix, md)
			if err == nil {
				t.Fatalf("decoded %q from broken chunks", got)
			}
			if !errors.Is(err, opensandbox.ErrCorruptAnnotations) {
				t.Fatalf("err = %v, want ErrCorruptAnnotations", err)
			}
			for _, v := range md {
				if len(v) > 8 && strings.Contains(err.Error(), v) {
					t.Fatalf("the error quotes a value: %v", err)
				}
			}
		})
	}
}

func lastIndex(md map[string]string) string { return index(len(md) - 1) }
func nextIndex(md map[string]string) string { return index(len(md)) }
func index(i int) string {
	return string([]byte{byte('0' + i/100), byte('0' + i/10%10), byte('0' + i%10)})
}
