//go:build e2e

package batchsandboxenv

import (
	"archive/tar"
	"context"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestE2EBusyboxLayerHasAShell builds the images' base from the peer's busybox
// (so it needs the peer: an e2e test, run by make e2e):
// /bin/sh (bootstrap.sh's interpreter) and the commands bootstrap.sh and the
// execd-installer run link to /bin/busybox.
func TestE2EBusyboxLayerHasAShell(t *testing.T) {
	dir := Assets(t)
	l, err := busyboxLayer(context.Background(), filepath.Join(dir, "busybox"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "sandbox")
	if err := writeLayout(out, Commit, []v1.Layer{l}, []string{"/bin/sh"}); err != nil {
		t.Fatal(err)
	}
	files := flatten(t, readLayout(t, out, Commit))
	if h := files["bin/busybox"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 {
		t.Fatalf("bin/busybox: %+v", h)
	}
	for _, cmd := range []string{"sh", "cp", "chmod", "mkdir", "touch", "dirname", "tr", "id", "sleep", "tail"} {
		if h := files["bin/"+cmd]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
			t.Errorf("bin/%s: %+v, want a link to busybox", cmd, h)
		}
	}
	if h := files["tmp"]; h == nil || h.Mode&0o1777 != 0o1777 {
		t.Errorf("tmp: %+v, want mode 1777", h)
	}
}
