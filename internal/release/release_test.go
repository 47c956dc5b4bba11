package release

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/registryenv"
)

const chartDir = "../../deploy/helm/gitea-dynamic-runner"

var names = []string{"dispatch", "handle", "recover", "gateway", "runner", "runner-host", "buildkit"}

// releasePlatforms are a release's platforms (imagebuild.Platforms).
var releasePlatforms = []string{"linux/amd64", "linux/arm64/v8"}

// fakeImages writes a layout per name as make release's make images does: one
// multi-architecture index of releasePlatforms, referenced as latest. Random content: the
// release must not care what is inside.
func fakeImages(t *testing.T) (string, map[string]v1.ImageIndex) {
	t.Helper()
	return fakeImagesFor(t, releasePlatforms)
}

// fakeImagesFor is fakeImages with an image per platform of platforms.
func fakeImagesFor(t *testing.T, platforms []string) (string, map[string]v1.ImageIndex) {
	t.Helper()
	dir := t.TempDir()
	built := map[string]v1.ImageIndex{}
	for _, n := range names {
		var adds []mutate.IndexAddendum
		for _, ps := range platforms {
			im, err := random.Image(256, 1)
			if err != nil {
				t.Fatal(err)
			}
			p, err := v1.ParsePlatform(ps)
			if err != nil {
				t.Fatal(err)
			}
			adds = append(adds, mutate.IndexAddendum{Add: im, Descriptor: v1.Descriptor{Platform: p}})
		}
		idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
		p, err := layout.Write(filepath.Join(dir, n), empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "latest"})); err != nil {
			t.Fatal(err)
		}
		built[n] = idx
	}
	return dir, built
}

func options(images, out string) Options {
	return Options{Version: "v1.2.3-rc.1", Registry: "registry.example.net/gdr", Images: images, Names: names,
		Platforms: releasePlatforms, Chart: chartDir, Out: out, Time: time.Unix(1_700_000_000, 0).UTC(), Changelog: "../../CHANGELOG.md"}
}

// TestChangelogSection: a release's notes are its changelog section, a version without one is
// refused, and a pre-release may have none.
func TestChangelogSection(t *testing.T) {
	images, _ := fakeImages(t)
	changelog := filepath.Join(t.TempDir(), "CHANGELOG.md")
	if err := os.WriteFile(changelog, []byte("# Changelog\n\n## [Unreleased]\n\n- next\n\n## [v1.2.3] - 2026-12-07\n\n### Added\n\n- this\n\n## [v1.2.2]\n\n- older\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		version, notes, err string
	}{
		{"v1.2.3", "## [v1.2.3] - 2026-12-07\n\n### Added\n\n- this\n\n", ""},
		{"v1.2.4", "", `has no section "## [v1.2.4]"`},
		{"v1.2.4-rc.1", "", ""},
	} {
		t.Run(c.version, func(t *testing.T) {
			o := options(images, filepath.Join(t.TempDir(), "r"))
			o.Version, o.Changelog = c.version, changelog
			_, err := Make(o)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("Make: %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			notes, err := os.ReadFile(filepath.Join(o.Out, "NOTES.md"))
			if string(notes) != c.notes || (c.notes == "" && !os.IsNotExist(err)) {
				t.Fatalf("NOTES.md %q (%v), want %q", notes, err, c.notes)
			}
		})
	}
}

// TestMake: a release stamps each image's index with its version (the platform images
// untouched), packages the chart with its version and every image the chart names pinned to
// the release's references, lists every file in SHA256SUMS, and is reproducible.
func TestMake(t *testing.T) {
	images, built := fakeImages(t)
	out := filepath.Join(t.TempDir(), "r")
	m, err := Make(options(images, out))
	if err != nil {
		t.Fatal(err)
	}
	if m.ChartVersion != "1.2.3-rc.1" || m.Chart != "gitea-dynamic-runner-1.2.3-rc.1.tgz" || m.ChartRef() != "oci://registry.example.net/gdr/gitea-dynamic-runner" {
		t.Errorf("manifest %+v", m)
	}
	for _, n := range names {
		idx, err := releasedIndex(filepath.Join(out, "images", n))
		if err != nil {
			t.Fatal(err)
		}
		d, _ := idx.Digest()
		want := "registry.example.net/gdr/gitea-dynamic-runner-" + n + ":v1.2.3-rc.1@" + d.String()
		if m.Images[n] != want {
			t.Errorf("image %s: %s, want %s", n, m.Images[n], want)
		}
		im, _ := idx.IndexManifest()
		src, _ := built[n].IndexManifest()
		if im.Annotations["org.opencontainers.image.version"] != "v1.2.3-rc.1" {
			t.Errorf("image %s: annotations %v", n, im.Annotations)
		}
		if len(im.Manifests) != len(src.Manifests) || im.Manifests[0].Digest != src.Manifests[0].Digest {
			t.Errorf("image %s: the platform images changed", n)
		}
		if srcDigest, _ := built[n].Digest(); srcDigest == d {
			t.Errorf("image %s: the index is make images' own, not stamped", n)
		}
	}

	archive, err := os.ReadFile(filepath.Join(out, m.Chart))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.LoadArchive(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Version != "1.2.3-rc.1" || ch.Metadata.AppVersion != "v1.2.3-rc.1" {
		t.Errorf("Chart.yaml: version %s appVersion %s", ch.Metadata.Version, ch.Metadata.AppVersion)
	}
	vals, err := util.ToRenderValuesWithSchemaValidation(ch, map[string]any{}, common.ReleaseOptions{Name: "gdr", Namespace: "gitea-dynamic-runner"}, nil, false)
	if err != nil {
		t.Fatalf("the released chart's values fail its schema: %v", err)
	}
	rendered, err := engine.Render(ch, vals)
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, s := range rendered {
		all.WriteString(s)
	}
	refs := regexp.MustCompile(`[^\s"']*gitea-dynamic-runner-[a-z-]+:[^\s"']+`).FindAllString(all.String(), -1)
	seen := map[string]bool{}
	for _, r := range refs {
		if !slices.Contains(namesOf(m), r) {
			t.Errorf("the released chart names %s, not an image of the release", r)
		}
		seen[r] = true
	}
	for _, n := range append(slices.Clone(Functions), poolImages...) {
		if !seen[m.Images[n]] {
			t.Errorf("the released chart never names %s (%s)", n, m.Images[n])
		}
	}
	if err := checkSums(out); err != nil {
		t.Errorf("SHA256SUMS: %v", err)
	}
	again := filepath.Join(t.TempDir(), "r")
	if _, err := Make(options(images, again)); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	b, _ := os.ReadFile(filepath.Join(again, "SHA256SUMS"))
	if !bytes.Equal(a, b) {
		t.Errorf("two releases of the same images differ:\n%s\n%s", a, b)
	}
}

func namesOf(m *Manifest) []string {
	var refs []string
	for _, r := range m.Images {
		refs = append(refs, r)
	}
	return refs
}

// TestMakeRefuses: each bad input fails the release with an error naming what is wrong.
func TestMakeRefuses(t *testing.T) {
	images, _ := fakeImages(t)
	oneArch, _ := fakeImagesFor(t, releasePlatforms[:1])
	reversed, _ := fakeImagesFor(t, []string{releasePlatforms[1], releasePlatforms[0]})
	brokenChart := t.TempDir()
	if err := os.CopyFS(brokenChart, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	values, _ := os.ReadFile(filepath.Join(brokenChart, "values.yaml"))
	if err := os.WriteFile(filepath.Join(brokenChart, "values.yaml"), bytes.Replace(values, []byte("  digests: {}\n"), nil, 1), 0o644); err != nil {
		t.Fatal(err)
	}
	full := t.TempDir()
	_ = os.WriteFile(filepath.Join(full, "x"), nil, 0o644)
	for _, c := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no v", func(o *Options) { o.Version = "1.2.3" }, `version "1.2.3"`},
		{"not semver", func(o *Options) { o.Version = "v1.2" }, `version "v1.2"`},
		{"build metadata", func(o *Options) { o.Version = "v1.2.3+abc" }, "build metadata"},
		{"no registry", func(o *Options) { o.Registry = "" }, `registry ""`},
		{"bad registry", func(o *Options) { o.Registry = "Registry.example.net/GDR" }, `registry "Registry.example.net/GDR"`},
		{"image the chart needs", func(o *Options) { o.Names = []string{"dispatch"} }, "image handle: the chart names it"},
		{"missing layout", func(o *Options) { o.Names = append(slices.Clone(names), "docker") }, "image docker"},
		{"used folder", func(o *Options) { o.Out = full }, "is not empty"},
		{"one platform", func(o *Options) { o.Images = oneArch }, "platforms [linux/amd64], a release's are [linux/amd64 linux/arm64/v8]"},
		{"platforms out of order", func(o *Options) { o.Images = reversed }, "platforms [linux/arm64/v8 linux/amd64]"},
		{"no platforms", func(o *Options) { o.Platforms = nil }, "no platforms"},
		{"unpinnable values", func(o *Options) { o.Chart = brokenChart }, "images.digests: found 0 lines"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := options(images, filepath.Join(t.TempDir(), "r"))
			c.edit(&o)
			_, err := Make(o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Make: %v, want an error with %q", err, c.want)
			}
		})
	}
}

// TestPush: the release's images and chart reach a real registry (go-containerregistry's),
// the images by the digests the chart pins, the chart as Helm pulls it; a release is pushed
// only to the registry it names, and not at all once a file differs from SHA256SUMS.
func TestPush(t *testing.T) {
	images, _ := fakeImages(t)
	reg := registryenv.StartAnonymous(t)
	out := filepath.Join(t.TempDir(), "r")
	o := options(images, out)
	o.Registry = reg.Addr + "/gdr"
	m, err := Make(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := Push(ctx, out, PushOptions{Registry: "registry.example.net/gdr", PlainHTTP: true}); err == nil ||
		!strings.Contains(err.Error(), `made for registry "`+o.Registry+`", not "registry.example.net/gdr"`) {
		t.Fatalf("push to another registry: %v", err)
	}
	var log bytes.Buffer
	if _, err := Push(ctx, out, PushOptions{Registry: o.Registry, PlainHTTP: true, Log: &log}); err != nil {
		t.Fatal(err)
	}
	t.Logf("push:\n%s", log.String())
	for n, ref := range m.Images {
		_, digest, _ := strings.Cut(ref, "@")
		d, err := name.NewDigest(o.Registry+"/"+ImagePrefix+n+"@"+digest, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := remote.Index(d); err != nil {
			t.Errorf("image %s by the chart's digest: %v", n, err)
		}
	}
	pulled, err := PullChart(m.ChartRef(), m.ChartVersion, true)
	if err != nil {
		t.Fatal(err)
	}
	archive, _ := os.ReadFile(filepath.Join(out, m.Chart))
	if !bytes.Equal(pulled, archive) {
		t.Error("the chart pulled from the registry is not the release's")
	}

	f := filepath.Join(out, m.Chart)
	if err := os.WriteFile(f, append(archive, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Push(ctx, out, PushOptions{Registry: o.Registry, PlainHTTP: true}); err == nil || !strings.Contains(err.Error(), m.Chart+" is ") {
		t.Fatalf("push of a changed release: %v, want SHA256SUMS naming %s", err, m.Chart)
	}
}
