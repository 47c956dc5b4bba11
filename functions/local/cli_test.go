package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dirlock"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
)

// The command line follows every function's conventions
// (functiontest.Conventions), run in process; without configuration it
// exits 2 and says so.
func TestCommandLine(t *testing.T) {
	functiontest.Run(t, "local", execute, append(functiontest.Conventions("local", true),
		functiontest.Case{Name: "no configuration", Code: 2, Want: []string{"local: configuration: --gitea-url (GDR_GITEA_URL) is required"}}))
}

// A state directory another process holds is refused before anything else
// (Gitea is not even asked), naming the holder.
func TestStateDirectoryHeld(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	lock, err := dirlock.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	var stderr bytes.Buffer
	code := execute(t.Context(), []string{"--gitea-url", "http://127.0.0.1:1/", "--state-dir", dir}, &stderr)
	want := fmt.Sprintf("another local mode runs with state directory %s: process %d on ", dir, os.Getpid())
	if code != function.ExitFailed || !strings.Contains(stderr.String(), want) || strings.Contains(stderr.String(), "cannot reach Gitea") {
		t.Fatalf("exit %d:\n%s\nwant exit 1 saying %q", code, stderr.String(), want)
	}
}

// A state directory that already exists with a mode others may read (a
// 0755 made by hand, or by an older local mode) is made the user's alone
// (0700) at start: it holds the pool's credentials, keys and CA.
func TestStateDirectoryMadePrivate(t *testing.T) {
	t.Setenv("GDR_REGISTRATION_TOKEN", "")
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("state directory before the start: %v, %v; want 0755", st.Mode(), err)
	}
	var stderr bytes.Buffer
	code := execute(t.Context(), []string{"--gitea-url", "http://127.0.0.1:1/", "--state-dir", dir}, &stderr)
	// It got as far as the registration, which has no token on a first start.
	if want := "a registration token is required"; code != function.ExitFailed || !strings.Contains(stderr.String(), want) {
		t.Fatalf("exit %d:\n%s\nwant exit 1 saying %q", code, stderr.String(), want)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("state directory after the start: %v, %v; want 0700", st.Mode(), err)
	}
}
