package opensandboxenv

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseCgroupDirs(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"memory", "cpu", "systemd", "unified"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	in := "9:name=systemd:/\n4:memory:/session/abc\n1:cpu:/\n3:pids:/\n0::/\n"
	got, err := parseCgroupDirs(strings.NewReader(in), root, "gdr-osd-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		filepath.Join(root, "systemd", "gdr-osd-1"),
		filepath.Join(root, "memory", "session", "abc", "gdr-osd-1"),
		filepath.Join(root, "cpu", "gdr-osd-1"),
		// pids is not mounted under root: left out.
		filepath.Join(root, "unified", "gdr-osd-1"),
	}
	if !slices.Equal(got, want) {
		t.Errorf("parseCgroupDirs:\n got %q\nwant %q", got, want)
	}

	// A v2-only layout: the root is the unified hierarchy.
	v2 := t.TempDir()
	if err := os.WriteFile(filepath.Join(v2, "cgroup.controllers"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = parseCgroupDirs(strings.NewReader("0::/user.slice/x\n"), v2, "gdr-osd-2")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(v2, "user.slice", "x", "gdr-osd-2")}; !slices.Equal(got, want) {
		t.Errorf("parseCgroupDirs v2: got %q, want %q", got, want)
	}
}

// TestWriteRootfs: every applet `busybox --list-full` names is a link to
// /bin/busybox, every folder comes once and before what it holds, /tmp is
// sticky, and the extra files are there.
func TestWriteRootfs(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "busybox")
	script := "#!/bin/sh\n[ \"$1\" = --list-full ] || exit 1\necho bin/busybox; echo bin/sh; echo usr/bin/tail; echo sbin/init\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "root.tar")
	err := writeRootfs(out, fake, func(r *rootfs) error { return r.bytes("usr/local/bin/runner", 0o755, []byte("x")) })
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]*tar.Header{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		if seen[name] != nil {
			t.Errorf("%s written twice", name)
		}
		if parent := path.Dir(name); parent != "." && seen[parent] == nil {
			t.Errorf("%s written before its folder %s", name, parent)
		}
		seen[name] = h
	}
	for _, applet := range []string{"bin/sh", "usr/bin/tail", "sbin/init"} {
		if h := seen[applet]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/bin/busybox" {
			t.Errorf("%s: %+v, want a link to /bin/busybox", applet, h)
		}
	}
	if h := seen["bin/busybox"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode != 0o755 {
		t.Errorf("bin/busybox: %+v, want an executable file", h)
	}
	if h := seen["tmp"]; h == nil || h.Mode != 0o1777 {
		t.Errorf("tmp: %+v, want mode 1777", h)
	}
	for _, name := range []string{"usr/local/bin/runner", "etc/passwd", "etc/group", "proc", "dev"} {
		if seen[name] == nil {
			t.Errorf("%s missing", name)
		}
	}
}
