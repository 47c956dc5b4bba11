package runner

import (
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
)

// TestMainAnswersHelpAndVersionWithoutBootstrap: -h and --version need no
// bootstrap values and exit 0, where a runner started without them refuses
// to run (2).
func TestMainAnswersHelpAndVersionWithoutBootstrap(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"-h"}, function.ExitOK},
		{[]string{"--help"}, function.ExitOK},
		{[]string{"--version"}, function.ExitOK},
		{[]string{"--nope"}, function.ExitConfig},
		{nil, function.ExitConfig}, // no CI_* bootstrap values
	} {
		if got := Main([]string{"runner"}, tc.args); got != tc.want {
			t.Errorf("Main(%q) = %d, want %d", tc.args, got, tc.want)
		}
	}
}
