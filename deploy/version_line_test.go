package deploy

import (
	"regexp"
	"testing"
)

// runnerVersionLine matches the line `runner --version` prints, whatever the
// build's stamp: "(devel)" from a build without version-control stamps
// (-buildvcs=false, outside a checkout), a pseudo-version and commit from a
// clone, "(modified)" from a checkout with changes; the toolchain last.
var runnerVersionLine = regexp.MustCompile(`runner (\(devel\)|v\S+)( commit [0-9a-f]{7,40}( \(modified\))?)? go1\.\d+`)

func TestRunnerVersionLineMatchesEveryStamp(t *testing.T) {
	for _, tc := range []struct {
		line string
		want bool
	}{
		{"#6 0.112 runner (devel) go1.26.8", true},
		{"#6 0.112 runner (devel) commit b772b7d7d9bd (modified) go1.26.8", true},
		{"#6 0.112 runner v0.0.0-20261204103612-b772b7d7d9bd commit b772b7d7d9bd0123456789abcdef0123456789ab go1.26.8", true},
		{`#6 [2/2] RUN ["/runner", "--version"]`, false},
		{"#6 0.112 /runner: not found", false},
	} {
		if got := runnerVersionLine.MatchString(tc.line); got != tc.want {
			t.Errorf("%q: matched %v, want %v", tc.line, got, tc.want)
		}
	}
}
