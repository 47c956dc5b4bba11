package imagebuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// elfMachine is the ELF machine of each platform's binaries.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// platformFS is one platform image's flattened file system: every entry's
// header, and the content of the regular files asked for.
type platformFS struct {
	platform v1.Platform
	config   *v1.ConfigFile
	headers  map[string]*tar.Header
	files    map[string][]byte
	caps     []string // files with file capabilities
}

// resolve follows symbolic links (relative or absolute, in the image) from
// name, an absolute path, to the entry they end at.
func (p *platformFS) resolve(name string) (string, *tar.Header, error) {
	name = strings.TrimPrefix(path.Clean(name), "/")
	for range 40 {
		h, ok := p.headers[name]
		if !ok {
			return name, nil, fmt.Errorf("%s: not in the image", name)
		}
		if h.Typeflag != tar.TypeSymlink {
			return name, h, nil
		}
		target := h.Linkname
		if !path.IsAbs(target) {
			target = path.Join(path.Dir("/"+name), target)
		}
		name = strings.TrimPrefix(path.Clean(target), "/")
	}
	return name, nil, fmt.Errorf("%s: too many symbolic links", name)
}

// checkImage opens the OCI layout at dir and checks what every image of
// ours must be: one image index (ref name "latest") whose images are exactly
// the platforms of one of platforms (in that order); in each, the binary as entrypoint, a
// numeric non-root user that /etc/passwd and /etc/group name, a CA bundle,
// no setuid or setgid file, and a static binary whose ELF machine is the
// platform's; the amd64 binary, run, answers --version with its name.
// wanted are more files whose content the caller wants (after symlinks
// are resolved the caller can find them in files). It returns each
// platform's file system, in Platforms order.
func checkImage(t *testing.T, dir string, img Image, platforms [][]Platform, wanted ...string) []*platformFS {
	t.Helper()
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("layout %s: %v", dir, err)
	}
	root, err := lp.ImageIndex()
	if err != nil {
		t.Fatalf("layout %s: %v", dir, err)
	}
	rootManifest, err := root.IndexManifest()
	if err != nil {
		t.Fatalf("layout %s: index.json: %v", dir, err)
	}
	if len(rootManifest.Manifests) != 1 {
		t.Fatalf("layout %s: index.json has %d entries, want one image index", dir, len(rootManifest.Manifests))
	}
	desc := rootManifest.Manifests[0]
	if !desc.MediaType.IsIndex() {
		t.Fatalf("layout %s: index.json's entry is %s, want an image index", dir, desc.MediaType)
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != RefName {
		t.Errorf("layout %s: ref name %q, want %q", dir, got, RefName)
	}
	idx, err := root.ImageIndex(desc.Digest)
	if err != nil {
		t.Fatalf("layout %s: image index: %v", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatalf("layout %s: image index: %v", dir, err)
	}
	var got []string
	for _, m := range im.Manifests {
		got = append(got, m.Platform.String())
	}
	if !slices.ContainsFunc(platforms, func(want []Platform) bool {
		var names []string
		for _, p := range want {
			names = append(names, p.String())
		}
		return slices.Equal(got, names)
	}) {
		t.Fatalf("layout %s: platforms %v, want one of %v", dir, got, platforms)
	}
	var out []*platformFS
	for _, m := range im.Manifests {
		image, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatalf("%s %s: %v", img.Name, m.Platform, err)
		}
		p := checkPlatform(t, image, *m.Platform, img, wanted)
		out = append(out, p)
	}
	return out
}

// checkPlatform checks one platform's image (see checkImage).
func checkPlatform(t *testing.T, image v1.Image, platform v1.Platform, img Image, wanted []string) *platformFS {
	t.Helper()
	what := img.Name + " " + platform.String()
	cfg, err := image.ConfigFile()
	if err != nil {
		t.Fatalf("%s: config: %v", what, err)
	}
	if cfg.OS != platform.OS || cfg.Architecture != platform.Architecture || cfg.Variant != platform.Variant {
		t.Errorf("%s: config says %s/%s/%s", what, cfg.OS, cfg.Architecture, cfg.Variant)
	}
	bin := BinDir + "/" + img.Binary
	var cmd []string
	var fileCaps map[string][]uint
	if img.Peer != nil {
		cmd, fileCaps = img.Peer.Cmd, img.Peer.FileCaps
		for _, b := range img.Peer.Binaries {
			wanted = append(wanted, BinDir+"/"+b)
		}
		for name := range img.Peer.Links {
			wanted = append(wanted, "/"+name)
		}
		for _, name := range img.Peer.Executables {
			wanted = append(wanted, "/"+name)
		}
		if img.Peer.SubIDs {
			wanted = append(wanted, "/etc/subuid", "/etc/subgid")
		}
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{bin}) {
		t.Errorf("%s: entrypoint %q, want [%s]", what, cfg.Config.Entrypoint, bin)
	}
	if !slices.Equal(cfg.Config.Cmd, cmd) {
		t.Errorf("%s: cmd %q, want %q", what, cfg.Config.Cmd, cmd)
	}
	uid, gid, ok := strings.Cut(cfg.Config.User, ":")
	u, errU := strconv.Atoi(uid)
	g, errG := strconv.Atoi(gid)
	if !ok || errU != nil || errG != nil || u == 0 || g == 0 {
		t.Errorf("%s: user %q, want numeric non-root uid:gid", what, cfg.Config.User)
	}
	if cfg.Created.IsZero() {
		t.Errorf("%s: no created time", what)
	}

	p := &platformFS{platform: platform, config: cfg, headers: map[string]*tar.Header{}, files: map[string][]byte{}}
	want := []string{"etc/passwd", "etc/group", strings.TrimPrefix(CABundle, "/"), strings.TrimPrefix(bin, "/")}
	for _, w := range wanted {
		want = append(want, strings.TrimPrefix(path.Clean(w), "/"))
	}
	rc := mutate.Extract(image)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: file system: %v", what, err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		p.headers[name] = h
		if h.Mode&(04000|02000) != 0 {
			t.Errorf("%s: %s has mode %o: setuid or setgid", what, name, h.Mode)
		}
		if v, ok := h.PAXRecords[xattrCapability]; ok {
			if caps, want := fileCaps[name]; !want || v != string(vfsCapData(caps)) {
				t.Errorf("%s: %s has file capabilities %x, want %x", what, name, v, vfsCapData(caps))
			}
			p.caps = append(p.caps, name)
		}
		if h.Typeflag == tar.TypeReg && slices.Contains(want, name) {
			if p.files[name], err = io.ReadAll(tr); err != nil {
				t.Fatalf("%s: %s: %v", what, name, err)
			}
		}
	}
	// Wanted files may be symbolic links: read their targets too.
	var again []string
	for _, w := range want {
		if target, h, err := p.resolve(w); err == nil && target != w && h.Typeflag == tar.TypeReg && p.files[target] == nil {
			again = append(again, target)
		}
	}
	if len(again) > 0 {
		readFiles(t, image, p, again)
	}

	if !hasLine(p.files["etc/passwd"], func(f []string) bool { return len(f) >= 4 && f[2] == uid && f[3] == gid }) {
		t.Errorf("%s: /etc/passwd has no entry for %s:\n%s", what, cfg.Config.User, p.files["etc/passwd"])
	}
	if !hasLine(p.files["etc/group"], func(f []string) bool { return len(f) >= 3 && f[2] == gid }) {
		t.Errorf("%s: /etc/group has no entry for group %s:\n%s", what, gid, p.files["etc/group"])
	}
	if !bytes.Contains(p.files[strings.TrimPrefix(CABundle, "/")], []byte("-----BEGIN CERTIFICATE-----")) {
		t.Errorf("%s: %s holds no certificate", what, CABundle)
	}
	data := p.files[strings.TrimPrefix(bin, "/")]
	if data == nil {
		t.Fatalf("%s: no %s", what, bin)
	}
	if h := p.headers[strings.TrimPrefix(bin, "/")]; h.Mode&0o111 != 0o111 || h.Uid != 0 {
		t.Errorf("%s: %s has mode %o owner %d, want executable by all, owned by root", what, bin, h.Mode, h.Uid)
	}
	if script, ok := img.Peer.script(img.Binary); ok {
		// The project's own script: as written, with its interpreter
		// (/bin/sh through the merged-/usr link) in the image.
		if !bytes.Equal(data, script) {
			t.Errorf("%s: %s is not the project's script", what, bin)
		}
		if h := p.headers["bin"]; !bytes.HasPrefix(data, []byte("#!/bin/sh\n")) || h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/bin" {
			t.Errorf("%s: %s is not a /bin/sh script, or /bin is not a link to usr/bin", what, bin)
		}
		if _, _, err := p.resolve("usr/bin/sh"); err != nil {
			t.Errorf("%s: no shell for %s: %v", what, bin, err)
		}
	} else {
		checkELF(t, what+" "+bin, data, platform.Architecture, true)
		if platform.Architecture == "amd64" {
			runVersion(t, what, data, img.Binary)
		}
	}
	for name := range fileCaps {
		if !slices.Contains(p.caps, name) {
			t.Errorf("%s: %s has no file capabilities", what, name)
		}
	}
	if img.Peer != nil {
		for _, b := range img.Peer.Binaries {
			name := strings.TrimPrefix(BinDir, "/") + "/" + b
			checkELF(t, what+" "+name, p.files[name], platform.Architecture, true)
		}
		for name := range img.Peer.Links {
			if _, _, err := p.resolve(name); err != nil {
				t.Errorf("%s: link %s: %v", what, name, err)
			}
		}
		for _, name := range img.Peer.Executables {
			target, _, err := p.resolve(name)
			if err != nil {
				t.Errorf("%s: %s: %v", what, name, err)
				continue
			}
			checkELF(t, what+" "+name+" ("+target+")", p.files[target], platform.Architecture, false)
		}
		if img.Peer.SubIDs {
			for _, f := range []string{"etc/subuid", "etc/subgid"} {
				if !hasLine(p.files[f], func(l []string) bool {
					return len(l) == 3 && l[0] == UserName && l[1] == strconv.Itoa(SubIDFirst) && l[2] == strconv.Itoa(SubIDCount)
				}) {
					t.Errorf("%s: /%s gives %s no %d IDs from %d:\n%s", what, f, UserName, SubIDCount, SubIDFirst, p.files[f])
				}
			}
		}
	}
	return p
}

// readFiles reads more regular files of the image into p.files.
func readFiles(t *testing.T, image v1.Image, p *platformFS, names []string) {
	t.Helper()
	rc := mutate.Extract(image)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("file system: %v", err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		if slices.Contains(names, name) {
			if p.files[name], err = io.ReadAll(tr); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}
}

// hasLine says whether one line of a colon-separated file matches.
func hasLine(data []byte, match func([]string) bool) bool {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if match(strings.Split(sc.Text(), ":")) {
			return true
		}
	}
	return false
}

// checkELF checks that data is an ELF executable for arch, and, when static
// is set, that it asks for no program interpreter (no dynamic linking).
func checkELF(t *testing.T, what string, data []byte, arch string, static bool) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Errorf("%s: not ELF: %v", what, err)
		return
	}
	if f.Machine != elfMachine[arch] {
		t.Errorf("%s: ELF machine %s, want %s for %s", what, f.Machine, elfMachine[arch], arch)
	}
	if !static {
		return
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Errorf("%s: dynamically linked (has a program interpreter)", what)
		}
	}
}

// runVersion runs the binary with --version, checks that it names itself
// first and returns what it printed.
func runVersion(t *testing.T, what string, data []byte, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Errorf("%s: %s --version: %v\n%s", what, name, err, out)
		return ""
	}
	if !strings.HasPrefix(string(out), name+" ") {
		t.Errorf("%s: %s --version printed %q, want it to start with %q", what, name, out, name+" ")
	}
	t.Logf("%s: %s", what, strings.TrimSpace(string(out)))
	return string(out)
}

// script returns the content of the script name among p's Scripts.
func (p *Peer) script(name string) ([]byte, bool) {
	if p == nil {
		return nil, false
	}
	b, ok := p.Scripts[name]
	return b, ok
}

// hostPlatform is this machine's platform, one of Platforms.
func hostPlatform(t *testing.T) Platform {
	t.Helper()
	i := slices.IndexFunc(Platforms, func(p Platform) bool { return p.Arch == runtime.GOARCH })
	if i < 0 {
		t.Fatalf("this machine's architecture %s is not one of %v", runtime.GOARCH, Platforms)
	}
	return Platforms[i]
}
