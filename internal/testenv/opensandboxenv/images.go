package opensandboxenv

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// rootfs is a root filesystem written as a tar archive for `docker import`:
// parents before children, each folder once, numeric root ownership.
type rootfs struct {
	tw   *tar.Writer
	dirs map[string]bool
	now  time.Time
}

func (r *rootfs) dir(name string, mode int64) error {
	name = strings.Trim(name, "/")
	if name == "" || name == "." || r.dirs[name] {
		return nil
	}
	if err := r.dir(path.Dir(name), 0o755); err != nil {
		return err
	}
	r.dirs[name] = true
	return r.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: r.now})
}

func (r *rootfs) bytes(name string, mode int64, data []byte) error {
	name = strings.Trim(name, "/")
	if err := r.dir(path.Dir(name), 0o755); err != nil {
		return err
	}
	if err := r.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: r.now}); err != nil {
		return err
	}
	_, err := r.tw.Write(data)
	return err
}

func (r *rootfs) file(name string, mode int64, src string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return r.bytes(name, mode, data)
}

func (r *rootfs) symlink(name, target string) error {
	name = strings.Trim(name, "/")
	if err := r.dir(path.Dir(name), 0o755); err != nil {
		return err
	}
	return r.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, ModTime: r.now})
}

// busyboxRoot writes a minimal root: busybox with a link per applet where
// `busybox --list-full` places it, /etc/passwd and /etc/group for root, and
// the usual empty folders.
func busyboxRoot(r *rootfs, busybox string) error {
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("%s --list-full: %w", busybox, err)
	}
	if err := r.file("bin/busybox", 0o755, busybox); err != nil {
		return err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "bin/busybox" {
			continue
		}
		if err := r.symlink(applet, "/bin/busybox"); err != nil {
			return err
		}
	}
	for _, d := range []string{"proc", "sys", "dev", "etc", "root", "opt", "usr/local/bin", "var"} {
		if err := r.dir(d, 0o755); err != nil {
			return err
		}
	}
	if err := r.dir("tmp", 0o1777); err != nil {
		return err
	}
	if err := r.bytes("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")); err != nil {
		return err
	}
	return r.bytes("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n"))
}

// writeRootfs writes the tar at p with busybox and whatever extra adds.
func writeRootfs(p, busybox string, extra func(*rootfs) error) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	defer f.Close()
	r := &rootfs{tw: tar.NewWriter(f), dirs: map[string]bool{}, now: time.Unix(0, 0)}
	if err := busyboxRoot(r, busybox); err != nil {
		return err
	}
	if extra != nil {
		if err := extra(r); err != nil {
			return err
		}
	}
	if err := r.tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// loadImages builds ExecdImage and SandboxImage and imports them into the
// server's Docker engine.
func (s *Server) loadImages(ctx context.Context, opts Options) error {
	busybox := filepath.Join(s.peer, "busybox")
	dir := filepath.Join(s.Dir, "images")
	execdTar := filepath.Join(dir, "execd.tar")
	// The server reads /execd and /bootstrap.sh out of a container of this
	// image running `tail -f /dev/null`.
	err := writeRootfs(execdTar, busybox, func(r *rootfs) error {
		if err := r.file("execd", 0o755, filepath.Join(s.peer, "execd")); err != nil {
			return err
		}
		return r.file("bootstrap.sh", 0o755, filepath.Join(s.peer, "bootstrap.sh"))
	})
	if err != nil {
		return fmt.Errorf("execd image: %w", err)
	}
	var runner string
	if !opts.NoRunner {
		if runner, err = buildRunner(ctx, dir); err != nil {
			return err
		}
	}
	sandboxTar := filepath.Join(dir, "sandbox.tar")
	err = writeRootfs(sandboxTar, busybox, func(r *rootfs) error {
		if runner == "" {
			return nil
		}
		return r.file(RunnerPath, 0o755, runner)
	})
	if err != nil {
		return fmt.Errorf("sandbox image: %w", err)
	}
	for tarPath, name := range map[string]string{execdTar: ExecdImage, sandboxTar: SandboxImage} {
		if _, err := s.Docker(ctx, "import", "--change", "ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", tarPath, name); err != nil {
			return err
		}
		_ = os.Remove(tarPath)
	}
	if opts.JobImage != "" {
		start := time.Now()
		if err := s.loadJobImage(ctx, opts.JobImage); err != nil {
			return err
		}
		s.log("opensandboxenv: %s imported from %s in %v", JobImageName, opts.JobImage, time.Since(start).Round(100*time.Millisecond))
	}
	return nil
}

// buildRunner builds functions/runner (static) into dir and returns its path.
func buildRunner(ctx context.Context, dir string) (string, error) {
	module, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "runner")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "./functions/runner")
	cmd.Dir = module
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./functions/runner: %w: %s", err, b)
	}
	return out, nil
}

// moduleRoot is the folder of the go.mod above the working directory.
func moduleRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("no go.mod above the working directory")
		}
		d = parent
	}
}
