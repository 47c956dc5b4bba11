package linked

import (
	"slices"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestEveryKnownKindIsLinked: a build without gdr_ tags (go test's) links
// every kind the wire format knows, each once, with its check and builder:
// a backend package's Registration names its own kind.
func TestEveryKnownKindIsLinked(t *testing.T) {
	seen := map[taskassignment.BackendKind]bool{}
	for _, r := range Backends() {
		if r.Check == nil || r.Build == nil || seen[r.Kind] {
			t.Errorf("registration %q: Check %v, Build %v, seen before %v", r.Kind, r.Check != nil, r.Build != nil, seen[r.Kind])
		}
		seen[r.Kind] = true
	}
	known := taskassignment.BackendKinds()
	slices.Sort(known)
	if got := Backends().Kinds(); !slices.Equal(got, known) {
		t.Errorf("linked %v, want every known kind %v", got, known)
	}
}
