// Package testenv is what the peer environments below it (giteaenv, kubeenv,
// spireenv) share: finding a peer that `make peers` built, and running it as a
// child of the test binary (see Process).
//
// The invariant every end-to-end test relies on: a test that needs a peer
// runs against the real peer or does not pass. RequirePeer skips the test on
// a developer machine without the build, and fails it when CI=true, so CI
// never passes on tests that did not run.
//
// Only the standard library is used here, so any package's tests may import it.
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Peer is a program the end-to-end tests run for real. `make peers` builds it
// once, outside the checkout, with scripts/peers/<Name>.sh build, into the
// folder <cache>/<Name>-<Version>, where <cache> is $GDR_PEERS, else
// $HOME/.cache/gitea-dynamic-runner. The script writes the stamp file
// .complete last, so a folder with the stamp holds a complete build.
//
// $GDR_<NAME>_DIR (Name in upper case, "-" as "_": GDR_GITEA_DIR,
// GDR_KUBE_NODE_DIR), when set, names the folder instead: a build made
// elsewhere, used as it is (no stamp needed).
type Peer struct {
	// Name names the build script and prefixes the folder: "gitea" for
	// scripts/peers/gitea.sh and <cache>/gitea-<Version>.
	Name string
	// Version is the release the script builds and the harness is written
	// against, e.g. "v1.27.3".
	Version string
	// Executables are the files the folder must hold as executables, relative
	// to it, e.g. "gitea".
	Executables []string
	// Folders are the folders it must hold, relative to it, e.g.
	// "static/options".
	Folders []string
}

// RequirePeer returns the folder holding p's build, with every one of
// p.Executables and p.Folders in it. When the build is missing or incomplete
// it ends the test: t.Skip on a developer machine, t.Fatal when the
// environment variable CI is "true". Either way the message says what is
// missing and that `make peers` builds it.
func RequirePeer(t testing.TB, p Peer) string {
	t.Helper()
	dir, err := findPeer(p)
	if err != nil {
		Unavailable(t, fmt.Sprintf("testenv: %v: run `make peers` (scripts/peers/%s.sh build)", err, p.Name))
	}
	return dir
}

// Unavailable ends a test that needs what this machine lacks (a peer, an
// image, root, a tool): t.Skip on a developer machine, t.Fatal when the
// environment variable CI is "true", where a missing part is a failure,
// never a silent skip. msg says what is missing and how to get it.
func Unavailable(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: a missing part is a failure)")
	}
	t.Skip(msg)
}

// findPeer returns p's folder, or an error naming what is missing.
func findPeer(p Peer) (string, error) {
	env := "GDR_" + strings.ToUpper(strings.ReplaceAll(p.Name, "-", "_")) + "_DIR"
	dir := os.Getenv(env)
	if dir == "" {
		root := os.Getenv("GDR_PEERS")
		if root == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("peer %s %s: no GDR_PEERS, %s or home directory: %w", p.Name, p.Version, env, err)
			}
			root = filepath.Join(home, ".cache", "gitea-dynamic-runner")
		}
		dir = filepath.Join(root, p.Name+"-"+p.Version)
		if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
			return dir, fmt.Errorf("peer %s %s not built: %s is not a complete build", p.Name, p.Version, dir)
		}
	}
	for _, name := range p.Executables {
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return dir, fmt.Errorf("peer %s %s not built: %s is not an executable file", p.Name, p.Version, path)
		}
	}
	for _, name := range p.Folders {
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
			return dir, fmt.Errorf("peer %s %s not built: %s is not a folder", p.Name, p.Version, path)
		}
	}
	return dir, nil
}
