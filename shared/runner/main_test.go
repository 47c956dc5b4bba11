package runner

import (
	"bytes"
	"os"
	"path/filepath"
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
		{[]string{"nope"}, function.ExitConfig}, // unknown command, said before the bootstrap is read
		{nil, function.ExitConfig},              // no CI_* bootstrap values
	} {
		if got := Main([]string{"runner"}, tc.args); got != tc.want {
			t.Errorf("Main(%q) = %d, want %d", tc.args, got, tc.want)
		}
	}
}

// TestInstallCopiesItself: `runner install <path>` copies the running
// executable to path, mode 0755, and says how it is used when the path is
// missing or cannot be written.
func TestInstallCopiesItself(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dest := filepath.Join(dir, "runner")
	if err := os.WriteFile(dest, []byte("an older copy"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := Main([]string{"runner"}, []string{"install", dest}); got != function.ExitOK {
		t.Fatalf("install: exit %d", got)
	}
	got, err := os.ReadFile(dest)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the copy differs from the executable (%v)", err)
	}
	if st, err := os.Stat(dest); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("copy's mode: %v %v, want 0755", st.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
	for _, args := range [][]string{{"install"}, {"install", "a", "b"}} {
		if got := Main([]string{"runner"}, args); got != function.ExitConfig {
			t.Errorf("Main(%q) = %d, want %d", args, got, function.ExitConfig)
		}
	}
	if got := Main([]string{"runner"}, []string{"install", filepath.Join(dir, "no", "such", "dir", "runner")}); got != function.ExitFailed {
		t.Errorf("install into a missing folder: exit %d, want %d", got, function.ExitFailed)
	}
}
