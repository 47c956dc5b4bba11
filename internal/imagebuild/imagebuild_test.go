package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// testCA stands in for the ca-certificates bundle in the small image.
var testCA = []byte("-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n")

// hello is the small image the builder is tested on in `make test` (the
// full set, in the e2e test, takes minutes to cross-compile).
var hello = Image{Name: "hello", Package: "./internal/imagebuild/testdata/hello", Binary: "hello"}

// TestBuildSmallImage builds the small image twice, into two folders: both
// builds give the same digests and the same layout files, and the image is
// what every image of ours must be (checkImage).
func TestBuildSmallImage(t *testing.T) {
	module, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	epoch := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var results [][]Result
	var outs []string
	for range 2 {
		out := t.TempDir()
		r, err := Build(context.Background(), Options{Module: module, Out: out, CABundle: testCA, Epoch: epoch, Commit: "0123abcd"}, []Image{hello})
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
		outs = append(outs, out)
	}
	first, second := results[0][0], results[1][0]
	if first.Digest != second.Digest || !slices.Equal(first.Manifests, second.Manifests) {
		t.Fatalf("two builds differ: %v %v, then %v %v", first.Digest, first.Manifests, second.Digest, second.Manifests)
	}
	t.Logf("both builds: %s (amd64 %s, arm64 %s)", first.Digest, first.Manifests[0], first.Manifests[1])
	for _, name := range []string{"index.json", "oci-layout"} {
		a, errA := os.ReadFile(filepath.Join(outs[0], "hello", name))
		b, errB := os.ReadFile(filepath.Join(outs[1], "hello", name))
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs between the builds (%v, %v)", name, errA, errB)
		}
	}

	fs := checkImage(t, filepath.Join(outs[0], "hello"), hello, [][]Platform{Platforms})
	// The stamp is there whatever the toolchain records (go test's GOFLAGS
	// may hold -buildvcs=false).
	if v := runVersion(t, "amd64", fs[0].files[strings.TrimPrefix(BinDir, "/")+"/"+hello.Binary], hello.Binary); !strings.Contains(v, "commit 0123abcd") {
		t.Errorf("--version = %q, want the stamped commit 0123abcd", v)
	}
	for _, p := range fs {
		if !p.config.Created.Time.Equal(epoch) {
			t.Errorf("%s: created %v, want %v", p.platform, p.config.Created.Time, epoch)
		}
		for name, h := range p.headers {
			if !h.ModTime.Equal(epoch) {
				t.Errorf("%s: %s modified %v, want %v", p.platform, name, h.ModTime, epoch)
			}
		}
		if h := p.headers["tmp"]; h == nil || h.Mode&0o1777 != 0o1777 {
			t.Errorf("%s: /tmp missing or not 1777", p.platform)
		}
		if h := p.headers["home/nonroot"]; h == nil || h.Uid != UID || h.Gid != GID {
			t.Errorf("%s: %s missing or not owned by the user", p.platform, Home)
		}
	}
}

// TestBuildOnePlatform: built for this machine's platform alone (make images
// for the tests), an image's index holds that one image, the very image a
// build for every platform (a release) holds for it: the same digest.
func TestBuildOnePlatform(t *testing.T) {
	module, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	host := hostPlatform(t)
	epoch := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	build := func(platforms []Platform) (Result, string) {
		t.Helper()
		out := t.TempDir()
		r, err := Build(context.Background(), Options{Module: module, Out: out, CABundle: testCA, Epoch: epoch, Platforms: platforms}, []Image{hello})
		if err != nil {
			t.Fatal(err)
		}
		return r[0], out
	}
	one, out := build([]Platform{host})
	all, _ := build(nil)
	if !slices.Equal(one.Platforms, []Platform{host}) || len(one.Manifests) != 1 {
		t.Fatalf("one platform: built %v, %d images", one.Platforms, len(one.Manifests))
	}
	if !slices.Equal(all.Platforms, Platforms) {
		t.Fatalf("default: built %v, want %v", all.Platforms, Platforms)
	}
	if want := all.Manifests[slices.Index(Platforms, host)]; one.Manifests[0] != want {
		t.Errorf("%s alone: image %s, the release build's %s", host, one.Manifests[0], want)
	}
	if one.Digest == all.Digest {
		t.Errorf("the one-platform index is the release's %s", all.Digest)
	}
	checkImage(t, filepath.Join(out, "hello"), hello, [][]Platform{{host}})
}

// TestPlatforms: ParsePlatforms takes make's PLATFORMS in any order and
// spelling and gives Platforms' order; Build refuses a set out of order or
// unknown, before building anything.
func TestPlatforms(t *testing.T) {
	amd64, arm64 := Platforms[0], Platforms[1]
	for _, c := range []struct {
		list string
		want []Platform
		err  string
	}{
		{"linux/amd64", []Platform{amd64}, ""},
		{"linux/arm64", []Platform{arm64}, ""},
		{"linux/arm64/v8,linux/amd64", []Platform{amd64, arm64}, ""},
		{"linux/amd64 linux/arm64 linux/amd64", []Platform{amd64, arm64}, ""},
		{"", nil, "none named"},
		{"linux/riscv64", nil, "linux/riscv64 is not one of"},
		{"amd64", nil, "amd64 is not one of"},
	} {
		got, err := ParsePlatforms(c.list)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParsePlatforms(%q) = %v, %v; want an error with %q", c.list, got, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("ParsePlatforms(%q) = %v, %v; want %v", c.list, got, err, c.want)
		}
	}
	for _, bad := range [][]Platform{{arm64, amd64}, {amd64, amd64}, {{Arch: "riscv64"}}} {
		out := t.TempDir()
		_, err := Build(context.Background(), Options{Module: "../..", Out: out, CABundle: testCA, Platforms: bad}, []Image{hello})
		if err == nil || !strings.Contains(err.Error(), "want a subset of") {
			t.Errorf("Build for %v: %v, want a refusal", bad, err)
		}
	}
}

// readLayer returns the entries of a layer file, and each file's content.
func readLayer(t *testing.T, path string) ([]tar.Header, map[string]string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var hdrs []tar.Header
	content := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs, content
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs = append(hdrs, *h)
		data, _ := io.ReadAll(tr)
		content[h.Name] = string(data)
	}
}

// TestTarLayer: parents come first, the first entry of a name wins, the
// setuid and setgid bits and anything but files, directories and links are
// dropped, and every entry has the one modification time.
func TestTarLayer(t *testing.T) {
	mtime := time.Unix(1700000000, 0)
	path := filepath.Join(t.TempDir(), "l.tar.gz")
	l, err := newTarLayer(path, mtime)
	if err != nil {
		t.Fatal(err)
	}
	steps := []error{
		l.bytes("./usr/bin/su", 0o4755, []byte("first")),
		l.bytes("usr/bin/su", 0o755, []byte("second")),
		l.write(tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666}, nil),
		l.dir("var/mail", 0o2775, 0, 8),
		l.symlink("bin/sh", "dash"),
		l.write(tar.Header{Typeflag: tar.TypeLink, Name: "usr/bin/su2", Linkname: "./usr/bin/su"}, nil),
		l.close(),
	}
	for _, err := range steps {
		if err != nil {
			t.Fatal(err)
		}
	}
	hdrs, content := readLayer(t, path)
	var names []string
	for _, h := range hdrs {
		names = append(names, h.Name)
		if !h.ModTime.Equal(mtime) {
			t.Errorf("%s: mtime %v", h.Name, h.ModTime)
		}
		if h.Mode&(04000|02000) != 0 {
			t.Errorf("%s: mode %o keeps setuid or setgid", h.Name, h.Mode)
		}
	}
	want := []string{"usr/", "usr/bin/", "usr/bin/su", "var/", "var/mail/", "bin/", "bin/sh", "usr/bin/su2"}
	if !slices.Equal(names, want) {
		t.Fatalf("entries %q, want %q", names, want)
	}
	if content["usr/bin/su"] != "first" {
		t.Errorf("usr/bin/su = %q, want the first entry's content", content["usr/bin/su"])
	}
	if hdrs[7].Linkname != "usr/bin/su" || hdrs[6].Linkname != "dash" || hdrs[4].Gid != 8 {
		t.Errorf("links or owner changed: %+v %+v %+v", hdrs[7], hdrs[6], hdrs[4])
	}
}

// fakeDeb builds a .deb named file in dir whose tree is files (name to
// content; a name ending in "*" is made setuid).
func fakeDeb(t *testing.T, dir, file, pkg string, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	control := "Package: " + pkg + "\nVersion: 1\nArchitecture: all\nMaintainer: test <t@example.com>\nDescription: test\n"
	if err := os.MkdirAll(filepath.Join(root, "DEBIAN"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "DEBIAN", "control"), []byte(control), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		mode := os.FileMode(0o644)
		if name[len(name)-1] == '*' {
			name, mode = name[:len(name)-1], 0o755|os.ModeSetuid
		}
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, file)
	if b, err := exec.Command("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, out).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, b)
	}
	return out
}

// TestTarLayerFileCaps: a file its layer's fileCaps names carries those
// capabilities as security.capability (what setcap writes: revision 2,
// effective, permitted), and loses its setuid bit like every other file.
func TestTarLayerFileCaps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.tar.gz")
	l, err := newTarLayer(path, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	l.fileCaps = map[string][]uint{"usr/bin/newuidmap": {CapSetUID}, "usr/bin/two": {CapSetGID, 33}}
	for _, name := range []string{"./usr/bin/newuidmap", "usr/bin/two", "usr/bin/newgidmap"} {
		if err := l.write(tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o4755, Size: 1}, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	hdrs, _ := readLayer(t, path)
	got := map[string]string{}
	for _, h := range hdrs {
		if h.Mode&(04000|02000) != 0 {
			t.Errorf("%s: mode %o keeps setuid or setgid", h.Name, h.Mode)
		}
		got[h.Name] = hex.EncodeToString([]byte(h.PAXRecords[xattrCapability]))
	}
	for name, want := range map[string]string{
		// setcap cap_setuid=ep, read back with getxattr on this machine.
		"usr/bin/newuidmap": "0100000280000000000000000000000000000000",
		"usr/bin/two":       "0100000240000000000000000200000000000000",
		"usr/bin/newgidmap": "",
	} {
		if got[name] != want {
			t.Errorf("%s: security.capability %q, want %q", name, got[name], want)
		}
	}
}

// TestDebs: the CA bundle is the package's certificates in name order, each
// ending in a newline; a package tree goes into a layer without its setuid
// bits, shared directories once.
func TestDebs(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		testenv.Unavailable(t, "dpkg-deb not found: the Debian packages are read with it")
	}
	dir := t.TempDir()
	ca := fakeDeb(t, dir, "ca-certificates_1_all.deb", "ca-certificates", map[string]string{
		"usr/share/ca-certificates/mozilla/B.crt": "B\n",
		"usr/share/ca-certificates/mozilla/A.crt": "A",
		"usr/share/doc/ca-certificates/README":    "not a certificate",
	})
	other := fakeDeb(t, dir, "login_1_all.deb", "login", map[string]string{
		"usr/bin/su*": "su",
	})
	bundle, err := caBundle(context.Background(), []string{other, ca})
	if err != nil {
		t.Fatal(err)
	}
	if string(bundle) != "A\nB\n" {
		t.Errorf("bundle %q, want %q", bundle, "A\nB\n")
	}
	if _, err := caBundle(context.Background(), []string{other}); err == nil {
		t.Error("a bundle without the ca-certificates package")
	}

	path := filepath.Join(t.TempDir(), "debs.tar.gz")
	l, err := newTarLayer(path, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := addDebs(context.Background(), l, []string{ca, other}); err != nil {
		t.Fatal(err)
	}
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	hdrs, content := readLayer(t, path)
	seen := map[string]int{}
	for _, h := range hdrs {
		seen[h.Name]++
		if h.Mode&(04000|02000) != 0 {
			t.Errorf("%s: mode %o keeps setuid or setgid", h.Name, h.Mode)
		}
	}
	if content["usr/bin/su"] != "su" || content["usr/share/ca-certificates/mozilla/A.crt"] != "A" {
		t.Errorf("package files missing: %v", seen)
	}
	if seen["usr/"] != 1 || seen["usr/share/"] != 1 {
		t.Errorf("shared directories not once: %v", seen)
	}
}

// TestEveryFunctionHasAnImage: a function added under functions/ gets an
// image, or a reason here not to. local runs from a checkout: its executors
// are processes on the host.
func TestEveryFunctionHasAnImage(t *testing.T) {
	entries, err := os.ReadDir("../../functions")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "local" {
			continue
		}
		if !slices.ContainsFunc(Images, func(i Image) bool { return i.Name == e.Name() && i.Package == "./functions/"+e.Name() }) {
			t.Errorf("functions/%s has no image in Images", e.Name())
		}
	}
	if !slices.ContainsFunc(Images, func(i Image) bool { return i.Packages && i.Binary == "runner" }) {
		t.Error("no runner image with the Debian packages (runner-host)")
	}
}
