package opensandbox

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
)

// OpenSandbox metadata values are Kubernetes label values (at most 63
// characters of [A-Za-z0-9-_.]), so annotations, whose values hold '/' and
// ':' (repository paths, SPIFFE IDs, images), are stored encoded: the
// URL-safe base64, without padding, of their JSON, in chunks of at most 63
// characters under ordered keys <prefix>/annotations-000, -001, ...

const (
	chunkName = "annotations-"
	// chunkDigits is the width of a chunk index: at most 1000 chunks.
	chunkDigits = 3
	maxChunks   = 1000
	chunkSize   = sandboxapi.MaxValueLength
)

func chunkKey(prefix string, i int) string {
	return fmt.Sprintf("%s/%s%0*d", prefix, chunkName, chunkDigits, i)
}

// EncodeAnnotations returns the metadata that carries annotations under
// prefix: the URL-safe base64 (no padding) of their JSON, cut into chunks of
// at most 63 characters under <prefix>/annotations-000, -001, ... Every chunk
// but the last is full. The encoding is deterministic (encoding/json writes
// map keys sorted): the same annotations always give the same metadata, and
// every value is a valid label value. A nil map encodes as an empty one.
func EncodeAnnotations(prefix string, annotations map[string]string) (map[string]string, error) {
	if annotations == nil {
		annotations = map[string]string{}
	}
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		if !utf8.ValidString(k) || !utf8.ValidString(annotations[k]) {
			return nil, fmt.Errorf("annotation %q is not valid UTF-8", k)
		}
	}
	data, err := json.Marshal(annotations)
	if err != nil {
		return nil, fmt.Errorf("encode annotations: %w", err)
	}
	encoded := base64.RawURLEncoding.EncodeToString(data)
	n := (len(encoded) + chunkSize - 1) / chunkSize
	if n > maxChunks {
		return nil, fmt.Errorf("annotations take %d chunks, more than %d", n, maxChunks)
	}
	out := make(map[string]string, n)
	for i := 0; i < n; i++ {
		out[chunkKey(prefix, i)] = encoded[i*chunkSize : min(len(encoded), (i+1)*chunkSize)]
	}
	return out, nil
}

// ErrCorruptAnnotations marks metadata whose annotation chunks do not
// decode.
var ErrCorruptAnnotations = errors.New("corrupt annotation chunks")

// DecodeAnnotations reads back the annotations EncodeAnnotations stored
// under prefix in metadata; keys not under <prefix>/annotations- are
// ignored. It fails (wrapping ErrCorruptAnnotations and naming the chunk key
// at fault, never a value) when there is no chunk, when a chunk key is not
// <prefix>/annotations-NNN, when the indexes are not exactly 000 up to the
// last (a chunk missing, out of order or beyond a gap), when a chunk but the
// last is not full, or when the chunks are not exactly what
// EncodeAnnotations writes for some annotations (corrupt base64 or JSON,
// anything non-canonical). So whatever decodes re-encodes to the same
// chunks.
func DecodeAnnotations(prefix string, metadata map[string]string) (map[string]string, error) {
	a, err := decodeAnnotations(prefix, metadata)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorruptAnnotations, err)
	}
	return a, nil
}

func decodeAnnotations(prefix string, metadata map[string]string) (map[string]string, error) {
	base := prefix + "/" + chunkName
	chunks := map[int]string{}
	for k, v := range metadata {
		suffix, ok := strings.CutPrefix(k, base)
		if !ok {
			continue
		}
		i, err := strconv.Atoi(suffix)
		if err != nil || len(suffix) != chunkDigits || strings.Trim(suffix, "0123456789") != "" {
			return nil, fmt.Errorf("metadata key %q is not a chunk key %s%s", k, base, strings.Repeat("N", chunkDigits))
		}
		chunks[i] = v
	}
	if len(chunks) == 0 {
		return nil, fmt.Errorf("no chunk %s", chunkKey(prefix, 0))
	}
	var encoded strings.Builder
	for i := range len(chunks) {
		v, ok := chunks[i]
		if !ok {
			return nil, fmt.Errorf("chunk %s is missing (%d chunks, indexes not 0 to %d)", chunkKey(prefix, i), len(chunks), len(chunks)-1)
		}
		last := i == len(chunks)-1
		if (!last && len(v) != chunkSize) || (last && (v == "" || len(v) > chunkSize)) {
			return nil, fmt.Errorf("chunk %s has %d characters (every chunk but the last has %d, the last 1 to %d)", chunkKey(prefix, i), len(v), chunkSize, chunkSize)
		}
		encoded.WriteString(v)
	}
	data, err := base64.RawURLEncoding.Strict().DecodeString(encoded.String())
	if err != nil {
		return nil, fmt.Errorf("chunks %s to %s are not URL-safe base64: %w", chunkKey(prefix, 0), chunkKey(prefix, len(chunks)-1), err)
	}
	var annotations map[string]string
	if err := json.Unmarshal(data, &annotations); err != nil {
		return nil, fmt.Errorf("chunks %s to %s are not a JSON object of strings: %w", chunkKey(prefix, 0), chunkKey(prefix, len(chunks)-1), err)
	}
	again, err := EncodeAnnotations(prefix, annotations)
	if err != nil {
		return nil, err
	}
	for i := range len(chunks) {
		if again[chunkKey(prefix, i)] != chunks[i] || len(again) != len(chunks) {
			return nil, fmt.Errorf("chunks %s to %s are not the canonical encoding of their annotations", chunkKey(prefix, 0), chunkKey(prefix, len(chunks)-1))
		}
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	return annotations, nil
}
