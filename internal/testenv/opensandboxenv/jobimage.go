package opensandboxenv

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// JobImageName is the name Options.JobImage is loaded under.
const JobImageName = "gdr-test/opensandbox-job:latest"

// loadJobImage flattens the OCI layout at dir (its image for this machine's
// architecture) into a root filesystem tar and imports it as JobImageName,
// keeping its user, environment and working directory (docker import drops
// the config otherwise). The server starts every sandbox through execd's
// bootstrap.sh, a /bin/sh script: an image without /bin/sh is refused.
func (s *Server) loadJobImage(ctx context.Context, dir string) error {
	img, err := platformImage(dir, runtime.GOARCH)
	if err != nil {
		return fmt.Errorf("job image %s: %w", dir, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("job image %s: config: %w", dir, err)
	}
	tarPath := filepath.Join(s.Dir, "images", "job.tar")
	if err := flatten(img, tarPath); err != nil {
		return fmt.Errorf("job image %s: %w", dir, err)
	}
	defer os.Remove(tarPath)
	args := []string{"import"}
	if u := cfg.Config.User; u != "" {
		args = append(args, "--change", "USER "+u)
	}
	for _, e := range cfg.Config.Env {
		k, v, ok := strings.Cut(e, "=")
		if !ok || strings.ContainsAny(v, " \t\n\"'\\$") {
			// Unquoted below: a value needing quotes is not carried over.
			return fmt.Errorf("job image %s: environment variable %q cannot be carried over", dir, k)
		}
		args = append(args, "--change", "ENV "+k+"="+v)
	}
	if w := cfg.Config.WorkingDir; w != "" {
		args = append(args, "--change", "WORKDIR "+w)
	}
	if _, err := s.Docker(ctx, append(args, tarPath, JobImageName)...); err != nil {
		return fmt.Errorf("job image %s: %w", dir, err)
	}
	return nil
}

// platformImage returns the image for arch (linux) of the layout at dir,
// looking through nested indexes.
func platformImage(dir, arch string) (v1.Image, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	return findImage(idx, arch, 0)
}

func findImage(idx v1.ImageIndex, arch string, depth int) (v1.Image, error) {
	if depth > 3 {
		return nil, errors.New("image indexes nested too deep")
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range m.Manifests {
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			if img, err := findImage(child, arch, depth+1); err == nil {
				return img, nil
			}
		case d.MediaType.IsImage() && (d.Platform == nil || d.Platform.OS == "linux" && d.Platform.Architecture == arch):
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("no linux/%s image", arch)
}

// flatten writes img's file system (its layers applied) as one tar at p, and
// checks it holds /bin/sh (through a /bin link to usr/bin too).
func flatten(img v1.Image, p string) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	defer f.Close()
	rc := mutate.Extract(img)
	defer rc.Close()
	links := map[string]string{}
	files := map[string]bool{}
	tr := tar.NewReader(io.TeeReader(rc, f))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("flatten: %w", err)
		}
		name := strings.Trim(path.Clean("/"+h.Name), "/")
		switch h.Typeflag {
		case tar.TypeSymlink:
			links[name] = h.Linkname
		case tar.TypeReg, tar.TypeLink:
			files[name] = true
		}
	}
	// The tar reader stops at the end-of-archive marker; copy the rest.
	if _, err := io.Copy(f, rc); err != nil {
		return fmt.Errorf("flatten: %w", err)
	}
	if !hasFile(files, links, "bin/sh") {
		return errors.New("no /bin/sh: the server's bootstrap.sh needs one")
	}
	return f.Close()
}

// hasFile resolves name through the image's symbolic links (absolute or
// relative, a few levels) and says whether it ends at a file.
func hasFile(files map[string]bool, links map[string]string, name string) bool {
	for range 16 {
		if files[name] {
			return true
		}
		resolved := false
		parts := strings.Split(name, "/")
		for i := 1; i <= len(parts); i++ {
			prefix := strings.Join(parts[:i], "/")
			target, ok := links[prefix]
			if !ok {
				continue
			}
			if !strings.HasPrefix(target, "/") {
				target = path.Join(path.Dir(prefix), target)
			}
			name = strings.Trim(path.Clean("/"+path.Join(append([]string{target}, parts[i:]...)...)), "/")
			resolved = true
			break
		}
		if !resolved {
			return false
		}
	}
	return false
}
