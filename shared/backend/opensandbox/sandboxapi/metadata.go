package sandboxapi

import (
	"maps"
	"net/url"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ReservedPrefix starts the metadata keys the server keeps for itself.
const ReservedPrefix = "opensandbox.io/"

// MaxValueLength is the longest metadata value the server accepts.
const MaxValueLength = validation.LabelValueMaxLength

// ValidateKey checks a metadata key against the server's rules: a Kubernetes
// qualified name ("name" or "prefix/name", name of at most 63 characters,
// prefix a lower-case DNS subdomain) outside ReservedPrefix. The error names
// the key.
func ValidateKey(key string) error {
	if strings.HasPrefix(key, ReservedPrefix) {
		return invalid("metadata key %q: the %s prefix is reserved", key, ReservedPrefix)
	}
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return invalid("metadata key %q: %s", key, strings.Join(errs, "; "))
	}
	return nil
}

// ValidateMetadata checks every key (ValidateKey) and value of m against the
// server's label rules: a value has at most MaxValueLength characters of
// [A-Za-z0-9-_.], starting and ending with a letter or digit, or is empty.
// The first offence in key order is returned; it names the key and never
// quotes the value.
func ValidateMetadata(m map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if err := ValidateKey(k); err != nil {
			return err
		}
		if err := validateValue(k, m[k]); err != nil {
			return err
		}
	}
	return nil
}

func validateValue(key, value string) error {
	if len(value) > MaxValueLength {
		return invalid("metadata %q: value is %d characters, more than %d", key, len(value), MaxValueLength)
	}
	if len(validation.IsValidLabelValue(value)) > 0 {
		return invalid("metadata %q: value is not a label value (letters, digits, '-', '_', '.', starting and ending with a letter or digit)", key)
	}
	return nil
}

// MetadataFilter returns the value of the `metadata` query parameter that
// selects the sandboxes whose metadata holds every pair of m (exact match):
// the pairs URL-encoded as one query string, keys sorted, such as
// "a.io%2Fk=v&k2=v2". The HTTP layer encodes that string once more as the
// parameter's value.
func MetadataFilter(m map[string]string) string {
	v := make(url.Values, len(m))
	for k, val := range m {
		v.Set(k, val)
	}
	return v.Encode()
}
