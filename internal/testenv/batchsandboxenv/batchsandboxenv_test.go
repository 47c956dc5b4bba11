package batchsandboxenv

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	imagespec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestLayoutHoldsTheExecdImage writes the execd image's layout from stand-in
// files and reads it back as `ctr images import` does: one linux/amd64 image
// under the ref name tag (so it imports as REPO:tag, not :latest), working in
// / (the execd-installer's `cp ./execd ...` runs there), with execd and
// bootstrap.sh executable at /.
func TestLayoutHoldsTheExecdImage(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"execd": "an execd", "bootstrap.sh": "#!/bin/sh\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l, err := filesLayer(map[string]string{"execd": filepath.Join(dir, "execd"), "bootstrap.sh": filepath.Join(dir, "bootstrap.sh")})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "execd")
	if err := writeLayout(out, Commit, []v1.Layer{l}, []string{"/execd"}); err != nil {
		t.Fatal(err)
	}
	img := readLayout(t, out, Commit)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || cf.Config.WorkingDir != "/" || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/execd" {
		t.Errorf("config %s/%s workdir %q entrypoint %q", cf.OS, cf.Architecture, cf.Config.WorkingDir, cf.Config.Entrypoint)
	}
	files := flatten(t, img)
	for _, name := range []string{"execd", "bootstrap.sh"} {
		h, ok := files[name]
		if !ok || h.Typeflag != tar.TypeReg || h.Mode&0o111 != 0o111 {
			t.Errorf("%s: %+v, want an executable file", name, h)
		}
	}
}

// readLayout returns the one image of the layout at dir, failing unless
// its ref name is tag and its platform linux/amd64.
func readLayout(t *testing.T, dir, tag string) v1.Image {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("%d manifests, want 1", len(m.Manifests))
	}
	d := m.Manifests[0]
	if d.Annotations[imagespec.AnnotationRefName] != tag || d.Platform == nil || d.Platform.OS != "linux" || d.Platform.Architecture != "amd64" {
		t.Fatalf("manifest annotations %v platform %+v", d.Annotations, d.Platform)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// flatten returns the headers of img's filesystem by name.
func flatten(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Clean(h.Name)] = h
	}
}
