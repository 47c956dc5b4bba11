//go:build e2e

package imagebuild

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// hostTools are what runner-host must carry for host-mode jobs (README.md,
// "The runner-host image").
var hostTools = []string{"/bin/sh", "/bin/bash", "/usr/bin/git", NodeDir + "/bin/node", "/usr/bin/curl",
	"/usr/bin/make", "/usr/bin/gcc", "/usr/bin/python3", "/usr/bin/zstd", "/usr/bin/git-lfs", "/usr/bin/xz",
	"/usr/bin/g++", "/usr/bin/wget", "/usr/bin/jq", "/usr/bin/zip", "/usr/bin/unzip", "/usr/bin/rsync", "/usr/bin/ssh"}

// imagesDir is the folder `make images` wrote ($GDR_IMAGES_DIR, else
// bin/images). Without it the test skips on a developer machine and fails
// under CI=true.
func imagesDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("GDR_IMAGES_DIR")
	if dir == "" {
		var err error
		if dir, err = filepath.Abs("../../bin/images"); err != nil {
			t.Fatal(err)
		}
	}
	for _, img := range Images {
		if _, err := os.Stat(filepath.Join(dir, img.Name, "index.json")); err != nil {
			testenv.Unavailable(t, "image "+img.Name+" not built in "+dir+": run `make images`")
		}
	}
	return dir
}

// TestE2EImages opens every image `make images` built and checks it
// (checkImage: platforms, this machine's alone (make images) or every one of
// Platforms (make release), entrypoint, user, static binary of the platform's
// ELF machine, no setuid file, --version), its CA bundle (Debian's, well over
// a hundred certificates), that the runner copies itself (`runner install`)
// to a copy that runs, and that runner-host's bash, git and node are the
// platform's and, on amd64, run in the image's own root (chroot, as the
// image's user), /bin/sh too.
func TestE2EImages(t *testing.T) {
	dir := imagesDir(t)
	for _, img := range Images {
		t.Run(img.Name, func(t *testing.T) {
			var wanted []string
			if img.Packages {
				wanted = hostTools
			}
			fs := checkImage(t, filepath.Join(dir, img.Name), img, [][]Platform{{hostPlatform(t)}, Platforms}, wanted...)
			for _, p := range fs {
				if n := bytes.Count(p.files[strings.TrimPrefix(CABundle, "/")], []byte("BEGIN CERTIFICATE")); n < 100 {
					t.Errorf("%s: %s holds %d certificates, want Debian's bundle", p.platform, CABundle, n)
				}
			}
			if img.Binary == "runner" {
				checkInstall(t, fs[0].files[strings.TrimPrefix(BinDir, "/")+"/runner"])
			}
			if img.Packages {
				checkHostTools(t, fs)
				runHostTools(t, filepath.Join(dir, img.Name))
			}
		})
	}
}

// checkInstall runs the amd64 runner's `install` and the copy's --version.
func checkInstall(t *testing.T, runner []byte) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "runner")
	if err := os.WriteFile(bin, runner, 0o755); err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, "shared-runner")
	if out, err := exec.Command(bin, "install", copyPath).CombinedOutput(); err != nil {
		t.Fatalf("runner install: %v\n%s", err, out)
	}
	out, err := exec.Command(copyPath, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "runner ") {
		t.Fatalf("installed runner --version: %v: %q", err, out)
	}
}

// checkHostTools: every host tool is in each platform's image (through its
// symbolic links) as an ELF binary of the platform's machine.
func checkHostTools(t *testing.T, fs []*platformFS) {
	t.Helper()
	for _, p := range fs {
		for _, tool := range hostTools {
			target, h, err := p.resolve(tool)
			if err != nil {
				t.Errorf("%s: %s: %v", p.platform, tool, err)
				continue
			}
			if h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 {
				t.Errorf("%s: %s (%s) is not an executable file", p.platform, tool, target)
				continue
			}
			checkELF(t, p.platform.String()+" "+tool+" ("+target+")", p.files[target], p.platform.Architecture, false)
		}
	}
}

// runHostTools unpacks the amd64 image of runner-host and runs its tools
// inside it (chroot, as the image's user): the package closure is complete
// when they start with nothing but the image's own loader and libraries.
func runHostTools(t *testing.T, dir string) {
	t.Helper()
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	root, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	rm, err := root.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := root.ImageIndex(rm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	image, err := idx.Image(im.Manifests[0].Digest) // amd64 (checkImage checked the order)
	if err != nil {
		t.Fatal(err)
	}
	rootfs := t.TempDir()
	unpack(t, image, rootfs)
	// A container runtime gives every container the devices of /dev that
	// git needs (null, urandom); the chroot gets them here.
	if err := os.MkdirAll(filepath.Join(rootfs, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, minor := range map[string]int{"null": 3, "zero": 5, "random": 8, "urandom": 9} {
		dev := filepath.Join(rootfs, "dev", name)
		if err := syscall.Mknod(dev, syscall.S_IFCHR|0o666, 1<<8|minor); err != nil {
			testenv.Unavailable(t, fmt.Sprintf("cannot make /dev/%s for the chroot here: %v", name, err))
		}
		if err := os.Chmod(dev, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	script := "set -e; git --version; node -e 'require(\"https\"); require(\"zlib\"); console.log(\"node \" + process.version)'; " +
		"bash -c 'echo bash $BASH_VERSION'; test -s " + CABundle + "; id -u; " +
		"cd /tmp && git init -q repo && git -C repo -c user.name=t -c user.email=t@example.com commit -q --allow-empty -m one && " +
		"echo commits $(git -C repo rev-list --count HEAD); " +
		"echo npm $(npm --version); npx --version >/dev/null; curl --version | head -n 1; git lfs version; " +
		"printf '#include <stdio.h>\\nint main(void) { puts(\"c-\" \"ok\"); return 0; }\\n' > hello.c && " +
		"printf 'hello: hello.c\\n\\tgcc -o $@ $<\\n' > Makefile && make -s && ./hello; " +
		"python3 -c 'import hashlib, json, ssl; print(\"python-\" + \"ok\")'; " +
		"tar --zstd -cf a.tar.zst hello.c && tar --zstd -tf a.tar.zst && tar -cJf a.tar.xz hello.c && echo archives-ok; " +
		// What else ubuntu-latest's workflows reach for: C++, pip and venv, jq, zip, wget, ssh, rsync.
		"printf '#include <iostream>\\nint main() { std::cout << \"cxx-\" \"ok\" << std::endl; }\\n' > hello.cpp && g++ -o hellocxx hello.cpp && ./hellocxx; " +
		"python3 -m pip --version | cut -d' ' -f1-2; python3 -m venv venv && ./venv/bin/python -c 'import sys; print(\"venv-\" + str(sys.prefix != sys.base_prefix))'; " +
		"echo '{\"a\":[1,2]}' | jq -r '\"jq-\" + (.a | length | tostring)'; zip -q a.zip hello.c && unzip -l a.zip | grep -q hello.c && echo zip-ok; " +
		"wget --version | head -n 1; ssh -V 2>&1 | cut -d, -f1; rsync --version | head -n 1; " +
		// BuildKit's client, and its wrapper's word where the pool builds nothing.
		"buildctl --version; if buildctl build --frontend dockerfile.v0 2>err.txt; then echo built-without-buildkit; else cat err.txt; fi; " +
		// ... and where the pool's BuildKit does not answer (its sidecar restarting): it waits, then says so.
		"if BUILDKIT_HOST=unix:///tmp/absent.sock GDR_BUILDKIT_WAIT=1 buildctl build --frontend dockerfile.v0 2>err.txt; then echo built-without-buildkit; else cat err.txt; fi; " +
		// The Docker CLI and its plugins; its wrapper's word where the pool has no Docker daemon,
		// and where the pool's daemon does not answer (its sidecar restarting).
		"docker --version; docker buildx version; docker compose version; " +
		"if docker ps 2>err.txt; then echo docker-without-daemon; else cat err.txt; fi; " +
		"if DOCKER_HOST=unix:///tmp/absent.sock GDR_DOCKER_WAIT=1 docker ps 2>err.txt; then echo docker-without-daemon; else cat err.txt; fi"
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + Home}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs, Credential: &syscall.Credential{Uid: UID, Gid: GID}}
	out, err := cmd.CombinedOutput()
	if errors.Is(err, syscall.EPERM) {
		testenv.Unavailable(t, fmt.Sprintf("chroot not permitted here: %v", err))
	}
	if err != nil {
		t.Fatalf("in runner-host (amd64): %v\n%s", err, out)
	}
	t.Logf("in runner-host (amd64):\n%s", out)
	if strings.Contains(string(out), "docker-without-daemon") {
		t.Errorf("in runner-host (amd64): docker ps succeeded without a daemon:\n%s", out)
	}
	if strings.Contains(string(out), "built-without-buildkit") {
		t.Errorf("in runner-host (amd64): buildctl build succeeded without BUILDKIT_HOST:\n%s", out)
	}
	for _, want := range []string{"git version ", "node v24.", "bash ", "65532", "commits 1", "npm 11.",
		"curl ", "git-lfs/", "c-ok", "python-ok", "archives-ok",
		"cxx-ok", "pip 23.", "venv-True", "jq-2", "zip-ok", "GNU Wget 1.21", "OpenSSH_9.2", "rsync  version 3.",
		"buildctl github.com/moby/buildkit ", "buildctl: no BuildKit runs beside this job: its runner pool has no build capability",
		"buildctl: BuildKit beside this job (unix:///tmp/absent.sock) does not answer (its sidecar gdr-buildkit starting again?); waiting up to 1s",
		"buildctl: BuildKit beside this job did not answer in 1s",
		"Docker version 26.1.5", "github.com/docker/buildx 0.13", "Docker Compose version 2.26",
		"docker: no Docker daemon runs beside this job: its runner pool has no docker capability",
		"docker: the Docker daemon beside this job (unix:///tmp/absent.sock) does not answer (its sidecar gdr-docker starting again?); waiting up to 1s",
		"docker: the Docker daemon beside this job did not answer in 1s"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("in runner-host (amd64): no %q in\n%s", want, out)
		}
	}
}

// unpack writes an image's file system into dir.
func unpack(t *testing.T, image v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(image)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Join(dir, filepath.Clean("/"+h.Name))
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(name, 0o755)
			if err == nil {
				err = os.Chmod(name, os.FileMode(h.Mode&0o777)|modeSticky(h.Mode))
			}
			if err == nil {
				err = os.Lchown(name, h.Uid, h.Gid)
			}
		case tar.TypeReg:
			var f *os.File
			f, err = os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode&0o777))
			if err == nil {
				_, err = io.Copy(f, tr)
				if errClose := f.Close(); err == nil {
					err = errClose
				}
			}
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, name)
		case tar.TypeLink:
			err = os.Link(filepath.Join(dir, filepath.Clean("/"+h.Linkname)), name)
		}
		if err != nil {
			t.Fatalf("unpack %s: %v", h.Name, err)
		}
	}
}

func modeSticky(mode int64) os.FileMode {
	if mode&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}
