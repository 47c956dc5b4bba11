// Package release makes a release of the product from the images `make images` built, and
// pushes it (`make release`, `make push`; deploy/REFERENCE.md, "The Helm chart and releases"). A release is a folder:
//
//	images/<name>/                    one OCI layout per image (linux/amd64 + linux/arm64,
//	                                  Options.Platforms), its index stamped with the version
//	gitea-dynamic-runner-<semver>.tgz the chart: version and appVersion the release's, every
//	                                  image it names <registry>/gitea-dynamic-runner-<name>:<version>@<digest>
//	release.json                      what was released: version, registry, each image's reference
//	SHA256SUMS                        every other file's, for `sha256sum -c`
//
// The chart names the registry the release is made for, so Push refuses any other: a chart
// whose defaults name images somewhere else would install what nobody pushed. A mirror copies
// the images by digest and sets the chart's images.registry (the digests stay true).
package release

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"sigs.k8s.io/yaml"
)

// ImagePrefix starts every image's repository name: <registry>/<ImagePrefix><name>.
const ImagePrefix = "gitea-dynamic-runner-"

// Functions are the images the chart's own Pods run, pinned by images.digests.
var Functions = []string{"dispatch", "handle", "recover", "gateway"}

// poolImages are the images the chart's default pool names in values.yaml, each written there
// as placeholderRegistry/<ImagePrefix><name>:latest and pinned by the release.
var poolImages = []string{"runner", "runner-host"}

// placeholderRegistry is the registry values.yaml names before a release.
const placeholderRegistry = "ghcr.io/example"

// Manifest is release.json: what a release holds.
type Manifest struct {
	Version      string `json:"version"`
	ChartVersion string `json:"chartVersion"`
	Registry     string `json:"registry"`
	// Chart is the chart archive's file name in the release folder.
	Chart string `json:"chart"`
	// Images maps each image's name to its reference, by tag and digest.
	Images map[string]string `json:"images"`
}

// ChartRef is the chart's OCI reference without its tag: oci://<registry>/gitea-dynamic-runner.
func (m *Manifest) ChartRef() string { return "oci://" + m.Registry + "/gitea-dynamic-runner" }

// Options are Make's.
type Options struct {
	// Version is the release's, vMAJOR.MINOR.PATCH[-PRERELEASE]; the chart's version is it
	// without the v.
	Version string
	// Registry is where the images will be pushed: <registry>/<ImagePrefix><name>.
	Registry string
	// Images is `make images`' folder, one OCI layout per name of Names.
	Images string
	// Names are the images to release.
	Names []string
	// Platforms are the platforms every image's index must hold, exactly and in this order
	// (OCI's names: linux/amd64, linux/arm64/v8; the command passes imagebuild.Platforms): `make
	// images` for the tests builds this machine's alone, and such a layout is refused.
	Platforms []string
	// Chart is the chart's folder.
	Chart string
	// Out is the release folder; it must not exist or be empty.
	Out string
	// Time is every timestamp of the chart archive (SOURCE_DATE_EPOCH).
	Time time.Time
	// Changelog is CHANGELOG.md: its section "## [<Version>]" becomes the release's NOTES.md.
	// A version without one is refused, but a pre-release (-rc.1, ...).
	Changelog string
}

// Make writes the release o describes into o.Out and returns its manifest.
func Make(o Options) (*Manifest, error) {
	if !strings.HasPrefix(o.Version, "v") {
		return nil, fmt.Errorf("release: version %q: want vMAJOR.MINOR.PATCH[-PRERELEASE]", o.Version)
	}
	sv, err := semver.StrictNewVersion(strings.TrimPrefix(o.Version, "v"))
	if err != nil {
		return nil, fmt.Errorf("release: version %q: want vMAJOR.MINOR.PATCH[-PRERELEASE]: %w", o.Version, err)
	}
	if sv.Metadata() != "" {
		return nil, fmt.Errorf("release: version %q: build metadata (+...) is not a valid image tag", o.Version)
	}
	if _, err := name.NewRepository(o.Registry + "/" + ImagePrefix + "dispatch"); err != nil || o.Registry == "" {
		return nil, fmt.Errorf("release: registry %q: not a registry and path images can be pushed under: %v", o.Registry, err)
	}
	for _, need := range append(slices.Clone(Functions), poolImages...) {
		if !slices.Contains(o.Names, need) {
			return nil, fmt.Errorf("release: image %s: the chart names it but the release lacks it", need)
		}
	}
	notes, err := changelogSection(o.Changelog, o.Version)
	if err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if notes == "" && sv.Prerelease() == "" {
		return nil, fmt.Errorf("release: %s has no section \"## [%s]\": write the release's changes there first (its [Unreleased] section, renamed)", o.Changelog, o.Version)
	}
	if len(o.Platforms) == 0 {
		return nil, errors.New("release: no platforms: name every platform a release's images hold")
	}
	if entries, err := os.ReadDir(o.Out); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("release: %s is not empty: a release folder is written once (remove it, or pick another version)", o.Out)
	}
	m := &Manifest{Version: o.Version, ChartVersion: sv.String(), Registry: o.Registry, Images: map[string]string{}}
	digests := map[string]v1.Hash{}
	for _, n := range o.Names {
		d, err := stampImage(filepath.Join(o.Images, n), filepath.Join(o.Out, "images", n), o.Version, o.Platforms)
		if err != nil {
			return nil, fmt.Errorf("release: image %s: %w", n, err)
		}
		digests[n] = d
		m.Images[n] = fmt.Sprintf("%s/%s%s:%s@%s", o.Registry, ImagePrefix, n, o.Version, d)
	}
	ch, err := loader.Load(o.Chart)
	if err != nil {
		return nil, fmt.Errorf("release: chart %s: %w", o.Chart, err)
	}
	if err := pinChart(ch, m, digests); err != nil {
		return nil, fmt.Errorf("release: chart %s: %w", o.Chart, err)
	}
	ch.StampModTimes(o.Time)
	file, err := chartutil.Save(ch, o.Out)
	if err != nil {
		return nil, fmt.Errorf("release: chart %s: %w", o.Chart, err)
	}
	m.Chart = filepath.Base(file)
	if notes != "" {
		if err := os.WriteFile(filepath.Join(o.Out, "NOTES.md"), []byte(notes), 0o644); err != nil {
			return nil, fmt.Errorf("release: %w", err)
		}
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Out, "release.json"), append(data, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if err := writeSums(o.Out); err != nil {
		return nil, fmt.Errorf("release: SHA256SUMS: %w", err)
	}
	return m, nil
}

// Read reads the manifest of the release folder dir.
func Read(dir string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, "release.json"))
	if err != nil {
		return nil, fmt.Errorf("release %s: %w (make release writes it)", dir, err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("release %s: release.json: %w", dir, err)
	}
	return &m, nil
}

// stampImage writes the multi-architecture index of the layout src, which must hold exactly
// platforms, its annotations given org.opencontainers.image.version, into a new layout dst and
// returns the new index's digest. The blobs are hard links to src's where the file system
// allows (copies elsewhere): only the index is new.
func stampImage(src, dst, version string, platforms []string) (v1.Hash, error) {
	inner, err := releasedIndex(src)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("%w (make images writes it)", err)
	}
	if mt, err := inner.MediaType(); err != nil || !mt.IsIndex() {
		return v1.Hash{}, fmt.Errorf("%s: want a multi-architecture index, found %s (%v)", src, mt, err)
	}
	im, err := inner.IndexManifest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("%s: %w", src, err)
	}
	var got []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			got = append(got, "(none)")
			continue
		}
		got = append(got, m.Platform.String())
	}
	if !slices.Equal(got, platforms) {
		return v1.Hash{}, fmt.Errorf("%s: platforms %v, a release's are %v: run `make release`, which builds the images for every platform (make images builds this machine's alone)", src, got, platforms)
	}
	stamped := mutate.Annotations(inner, map[string]string{"org.opencontainers.image.version": version}).(v1.ImageIndex)
	if err := linkTree(filepath.Join(src, "blobs"), filepath.Join(dst, "blobs")); err != nil {
		return v1.Hash{}, err
	}
	lp, err := layout.Write(dst, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := lp.AppendIndex(stamped, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": version})); err != nil {
		return v1.Hash{}, err
	}
	return stamped.Digest()
}

// linkTree hard-links every file of src into the same place under dst, copying where a link
// fails (another file system).
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		if os.Link(path, to) == nil {
			return nil
		}
		return copyFile(path, to)
	})
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// pinChart gives the chart the release's version and its values the release's images: the
// registry, the tag and each function's digest (images.*), and the default pool's runner
// images by reference. Each edit must find exactly the one line it replaces in values.yaml, so
// a change of the file that would leave an image unpinned fails the release.
func pinChart(ch *chart.Chart, m *Manifest, digests map[string]v1.Hash) error {
	ch.Metadata.Version, ch.Metadata.AppVersion = m.ChartVersion, m.Version
	i := slices.IndexFunc(ch.Raw, func(f *common.File) bool { return f.Name == chartutil.ValuesfileName })
	if i < 0 {
		return errors.New("no values.yaml")
	}
	values := string(ch.Raw[i].Data)
	var pins strings.Builder
	pins.WriteString("  digests:\n")
	for _, f := range Functions {
		fmt.Fprintf(&pins, "    %s: %q\n", f, digests[f].String())
	}
	type edit struct {
		what string
		re   *regexp.Regexp
		with string
	}
	edits := []edit{
		{"images.registry", regexp.MustCompile(`(?m)^  registry: .*\n`), fmt.Sprintf("  registry: %s   # the release's; a mirror: yours (the digests stay)\n", m.Registry)},
		{"images.tag", regexp.MustCompile(`(?m)^  tag: .*\n`), fmt.Sprintf("  tag: %s\n", m.Version)},
		{"images.digests", regexp.MustCompile(`(?m)^  digests: \{\}.*\n`), pins.String()},
	}
	for _, n := range poolImages {
		edits = append(edits, edit{"the default pool's " + n,
			regexp.MustCompile(regexp.QuoteMeta(placeholderRegistry+"/"+ImagePrefix+n+":latest") + `\b`), m.Images[n]})
	}
	for _, e := range edits {
		if got := len(e.re.FindAllStringIndex(values, -1)); got != 1 {
			return fmt.Errorf("values.yaml: %s: found %d lines to pin, want 1", e.what, got)
		}
		values = e.re.ReplaceAllLiteralString(values, e.with)
	}
	parsed := map[string]any{}
	if err := yaml.Unmarshal([]byte(values), &parsed); err != nil {
		return fmt.Errorf("values.yaml after pinning: %w", err)
	}
	ch.Raw[i].Data, ch.Values = []byte(values), parsed
	return nil
}

// writeSums writes dir/SHA256SUMS: every other file under dir, in `sha256sum -c`'s format.
func writeSums(dir string) error {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if rel != "SHA256SUMS" {
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(files)
	var sums strings.Builder
	for _, f := range files {
		h := sha256.New()
		in, err := os.Open(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		_, err = io.Copy(h, in)
		in.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(&sums, "%x  %s\n", h.Sum(nil), f)
	}
	return os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(sums.String()), 0o644)
}

// changelogSection returns the section of version in the changelog file (its "## [version]"
// heading to the next "## "), or "" when it has none.
func changelogSection(file, version string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("changelog: %w", err)
	}
	var out []string
	in := false
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## ["+version+"]")
		}
		if in {
			out = append(out, line)
		}
	}
	return strings.Join(out, ""), nil
}
