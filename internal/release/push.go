package release

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v4/pkg/registry"
)

// PushOptions are Push's.
type PushOptions struct {
	// Registry must be the one the release was made for (Manifest.Registry).
	Registry string
	// PlainHTTP talks HTTP, not HTTPS, to the registry (a test's or a local one).
	PlainHTTP bool
	// Log receives a line per pushed artifact.
	Log io.Writer
}

// Push checks the release folder dir against its SHA256SUMS and pushes its images (each under
// its version's tag, its digest the one the chart pins) and then its chart (OCI, at
// Manifest.ChartRef with the chart's version as tag), with the credentials of the Docker
// configuration (~/.docker/config.json) for both. The chart goes last: a chart in the registry
// names only images already there.
func Push(ctx context.Context, dir string, o PushOptions) (*Manifest, error) {
	m, err := Read(dir)
	if err != nil {
		return nil, err
	}
	if o.Registry != m.Registry {
		return nil, fmt.Errorf("release %s: made for registry %q, not %q: its chart names the images there (make release REGISTRY=%s, or mirror it: deploy/REFERENCE.md, \"The Helm chart and releases\")",
			m.Version, m.Registry, o.Registry, o.Registry)
	}
	if err := checkSums(dir); err != nil {
		return nil, fmt.Errorf("release %s: %w", m.Version, err)
	}
	log := o.Log
	if log == nil {
		log = io.Discard
	}
	var opts []name.Option
	if o.PlainHTTP {
		opts = append(opts, name.Insecure)
	}
	for n, ref := range m.Images {
		_, digest, _ := strings.Cut(ref, "@")
		idx, err := releasedIndex(filepath.Join(dir, "images", n))
		if err != nil {
			return nil, fmt.Errorf("release %s: image %s: %w", m.Version, n, err)
		}
		if d, err := idx.Digest(); err != nil || d.String() != digest {
			return nil, fmt.Errorf("release %s: image %s: the layout's index is %v, release.json says %s (%v)", m.Version, n, d, digest, err)
		}
		tag, err := name.NewTag(m.Registry+"/"+ImagePrefix+n+":"+m.Version, opts...)
		if err != nil {
			return nil, fmt.Errorf("release %s: image %s: %w", m.Version, n, err)
		}
		if err := remote.WriteIndex(tag, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return nil, fmt.Errorf("release %s: push %s: %w", m.Version, tag, err)
		}
		fmt.Fprintf(log, "pushed %s\n", ref)
	}
	client, err := registryClient(o.PlainHTTP)
	if err != nil {
		return nil, fmt.Errorf("release %s: %w", m.Version, err)
	}
	data, err := os.ReadFile(filepath.Join(dir, m.Chart))
	if err != nil {
		return nil, fmt.Errorf("release %s: %w", m.Version, err)
	}
	ref := strings.TrimPrefix(m.ChartRef(), "oci://") + ":" + m.ChartVersion
	res, err := client.Push(data, ref)
	if err != nil {
		return nil, fmt.Errorf("release %s: push the chart to %s: %w", m.Version, ref, err)
	}
	fmt.Fprintf(log, "pushed %s@%s (helm install ... %s --version %s)\n", ref, res.Manifest.Digest, m.ChartRef(), m.ChartVersion)
	return m, nil
}

// registryClient is Helm's OCI registry client, with the Docker configuration's credentials
// (Helm's own registry configuration first).
func registryClient(plainHTTP bool) (*registry.Client, error) {
	var opts []registry.ClientOption
	if plainHTTP {
		opts = append(opts, registry.ClientOptPlainHTTP())
	}
	return registry.NewClient(opts...)
}

// PullChart pulls the chart of version chartVersion at ref (oci://...) with Helm's registry
// client and returns the archive.
func PullChart(ref, chartVersion string, plainHTTP bool) ([]byte, error) {
	client, err := registryClient(plainHTTP)
	if err != nil {
		return nil, err
	}
	res, err := client.Pull(strings.TrimPrefix(ref, "oci://") + ":" + chartVersion)
	if err != nil {
		return nil, fmt.Errorf("pull %s:%s: %w", ref, chartVersion, err)
	}
	return res.Chart.Data, nil
}

// releasedIndex is the one image index a layout holds (make images' and a release's alike).
func releasedIndex(dir string) (v1.ImageIndex, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	outer, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := outer.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(im.Manifests) != 1 {
		return nil, fmt.Errorf("%s: %d descriptors, want one image index", dir, len(im.Manifests))
	}
	return outer.ImageIndex(im.Manifests[0].Digest)
}

// checkSums verifies every file SHA256SUMS of dir lists, and that it lists every file.
func checkSums(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		return err
	}
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		sum, file, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			return fmt.Errorf("SHA256SUMS: bad line %q", sc.Text())
		}
		listed[file] = true
		f, err := os.Open(filepath.Join(dir, filepath.FromSlash(file)))
		if err != nil {
			return fmt.Errorf("SHA256SUMS: %w", err)
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return err
		}
		if got := fmt.Sprintf("%x", h.Sum(nil)); got != sum {
			return fmt.Errorf("SHA256SUMS: %s is %s, listed as %s", file, got, sum)
		}
	}
	return filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if rel = filepath.ToSlash(rel); rel != "SHA256SUMS" && !listed[rel] {
			return fmt.Errorf("SHA256SUMS does not list %s", rel)
		}
		return nil
	})
}
