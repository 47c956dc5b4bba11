package opensandbox_test

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
)

// FuzzDecodeAnnotations: the decoder never panics, and whatever it decodes
// re-encodes to exactly the chunks it read.
func FuzzDecodeAnnotations(f *testing.F) {
	good, err := opensandbox.EncodeAnnotations(prefix, map[string]string{
		prefix + "/repository": "alice/repo", prefix + "/spiffe-id": "spiffe://ci.example.org/repo/alice/repo/task/42",
	})
	if err != nil {
		f.Fatal(err)
	}
	var chunks []string
	for i := range len(good) {
		chunks = append(chunks, good[fmt.Sprintf("%s/annotations-%03d", prefix, i)])
	}
	f.Add(strings.Join(chunks, "\n"), "")
	f.Add(strings.Join(chunks, "\n"), "annotations-007")
	f.Add("e30", "")
	f.Add("bnVsbA", "annotations-1")
	f.Add("eyJhIjoiMSJ9\n", "")
	f.Fuzz(func(t *testing.T, values, extraKey string) {
		md := map[string]string{}
		for i, v := range strings.Split(values, "\n") {
			md[fmt.Sprintf("%s/annotations-%03d", prefix, i)] = v
		}
		if extraKey != "" {
			md[prefix+"/"+extraKey] = "AAAA"
		}
		got, err := opensandbox.DecodeAnnotations(prefix, md)
		if err != nil {
			return
		}
		again, err := opensandbox.EncodeAnnotations(prefix, got)
		if err != nil {
			t.Fatalf("decoded %q does not encode: %v", got, err)
		}
		chunksRead := map[string]string{}
		for k, v := range md {
			if strings.HasPrefix(k, prefix+"/annotations-") {
				chunksRead[k] = v
			}
		}
		if !maps.Equal(again, chunksRead) {
			t.Fatalf("decoded %q from %q, which re-encodes to %q", got, chunksRead, again)
		}
	})
}
