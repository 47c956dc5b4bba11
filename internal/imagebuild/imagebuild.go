// Package imagebuild builds the project's container images on this machine,
// without a registry or a Docker daemon: each is an OCI image layout holding
// one image index with an image per platform built (Options.Platforms): a
// release's have every one of Platforms, linux/amd64 and linux/arm64; the
// tests' only this machine's.
//
// Every image is reproducible: the binaries are static (CGO_ENABLED=0) and
// built with -trimpath, every file has the same modification time (the
// epoch, SOURCE_DATE_EPOCH in `make images`), the image's created time is
// that epoch, and layers are written in a fixed order with numeric owners
// only; the same source, Go toolchain, packages and epoch give the same
// digests. Every image runs as 65532:65532 (nonroot, with /etc/passwd and
// /etc/group entries), carries a CA bundle from Debian's ca-certificates
// package, and has its binary as entrypoint.
package imagebuild

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The user every image runs as.
const (
	UID      = 65532
	GID      = 65532
	UserName = "nonroot"
	Home     = "/home/nonroot"
)

// BinDir is where an image's binary is, on the image's PATH.
const BinDir = "/usr/local/bin"

// CABundle is where every image has its CA certificates.
const CABundle = "/etc/ssl/certs/ca-certificates.crt"

// RefName is the reference name (org.opencontainers.image.ref.name) of the
// image index in each layout: `oci:<folder>:latest` to skopeo.
const RefName = "latest"

// Platform is one platform of every image.
type Platform struct {
	Arch    string // GOARCH, OCI architecture and Debian architecture alike
	Variant string
}

// String is the platform as OCI and Docker name it: linux/amd64, linux/arm64/v8.
func (p Platform) String() string {
	s := "linux/" + p.Arch
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// Platforms are every platform an image can be built for, in index order: a
// release's images have all of them.
var Platforms = []Platform{{Arch: "amd64"}, {Arch: "arm64", Variant: "v8"}}

// ParsePlatforms reads a comma- or space-separated list of platforms
// (linux/amd64, linux/arm64 or linux/arm64/v8: `make images` PLATFORMS) and
// returns them in Platforms order, each once. A platform not in Platforms, or
// an empty list, is an error.
func ParsePlatforms(list string) ([]Platform, error) {
	fields := strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' })
	if len(fields) == 0 {
		return nil, fmt.Errorf("platforms %q: none named", list)
	}
	want := map[Platform]bool{}
	for _, f := range fields {
		i := slices.IndexFunc(Platforms, func(p Platform) bool { return f == p.String() || f == "linux/"+p.Arch })
		if i < 0 {
			return nil, fmt.Errorf("platforms %q: %s is not one of %v", list, f, Platforms)
		}
		want[Platforms[i]] = true
	}
	return slices.DeleteFunc(slices.Clone(Platforms), func(p Platform) bool { return !want[p] }), nil
}

// Image is one image to build.
type Image struct {
	// Name names the layout's folder (Options.Out/<Name>).
	Name string
	// Package is the Go main package of the image's binary, relative to
	// Options.Module ("./functions/dispatch").
	Package string
	// Binary is the binary's name, in BinDir; the image's entrypoint.
	Binary string
	// Packages says the image carries the Debian packages of
	// Options.Packages (bash, git, curl, make, gcc, python3... and what they
	// need) and its Node.js and npm, in NodeDir.
	Packages bool
	// Peer, when set, makes the image one of a peer's prebuilt binaries
	// and Debian packages (Options.Peers[Name]) instead of a binary
	// compiled from Package.
	Peer *Peer
	// Tools are other peers' binaries the image carries too.
	Tools []Tool
}

// Tool is one binary of a peer's folder (Options.Peers[Peer]/<arch>/bin/)
// that an image carries at ToolDir/Binary, called through Wrapper at
// BinDir/Binary: a shell script that says what the tool needs where the
// executor lacks it, then runs the binary with its arguments.
type Tool struct {
	Peer, Binary string
	Wrapper      string
	// Dir, when set, is where the binary is instead, without a wrapper
	// (a plugin another tool finds there).
	Dir string
}

// ToolDir is where an image's Tools are; BinDir has their wrappers.
const ToolDir = "/usr/local/libexec/gitea-dynamic-runner"

// buildctlWrapper is runner-host's buildctl. Without BUILDKIT_HOST (the pool has no build
// capability) and without --addr, it fails at once with what to do instead of buildctl's dial
// error. With it, a BuildKit that does not answer is its sidecar restarting (killed, or out of
// memory at its limit): it waits for it, GDR_BUILDKIT_WAIT seconds (60), instead of failing to
// dial, and after a call that failed because BuildKit ended during it, it says so.
const buildctlWrapper = `#!/bin/sh
# BuildKit's client. A pool's build capability runs BuildKit beside the job
# (the sidecar gdr-buildkit) and sets BUILDKIT_HOST; without it, say so
# instead of failing to dial. With it, wait for a sidecar that restarts.
buildctl=` + ToolDir + `/buildctl
case " $* " in
*" --addr"* | *" --version "* | *" --help "* | *" -h "* | "  ") exec "$buildctl" "$@" ;;
esac
if [ -z "${BUILDKIT_HOST:-}" ]; then
	echo "buildctl: no BuildKit runs beside this job: its runner pool has no build capability (BUILDKIT_HOST is unset). An operator enables it per pool with build: in the pool's profile (README, Image builds); or pass --addr to a BuildKit of your own." >&2
	exit 1
fi
answers() { "$buildctl" debug workers >/dev/null 2>&1; }
if ! answers; then
	wait=${GDR_BUILDKIT_WAIT:-60}
	case $wait in '' | *[!0-9]*) wait=60 ;; esac
	echo "buildctl: BuildKit beside this job ($BUILDKIT_HOST) does not answer (its sidecar gdr-buildkit starting again?); waiting up to ${wait}s" >&2
	waited=0
	until answers; do
		if [ "$waited" -ge "$wait" ]; then
			echo "buildctl: BuildKit beside this job did not answer in ${wait}s: the executor Pod's events say why (its sidecar gdr-buildkit)" >&2
			exit 1
		fi
		sleep 1
		waited=$((waited + 1))
	done
	echo "buildctl: BuildKit answers again after ${waited}s" >&2
fi
"$buildctl" "$@"
rc=$?
if [ "$rc" -ne 0 ] && ! answers; then
	echo "buildctl: BuildKit beside this job stopped answering during this call: its sidecar gdr-buildkit ended (killed, or out of memory at the pool's build resources) and is started again; the next buildctl waits for it" >&2
fi
exit "$rc"
`

// Peer is what an image built from a peer's folder (a scripts/peers
// script's: <arch>/bin/ and <arch>/debs/ for each platform) carries.
type Peer struct {
	// Binaries are the files of <arch>/bin/ the image has in BinDir.
	Binaries []string
	// FileCaps give files of the peer's packages (paths in the image,
	// without the leading slash) file capabilities (effective and
	// permitted; capability numbers, as in linux/capability.h), in place
	// of the setuid bit their package gives them, which every file loses: a
	// helper that needs one privilege gets that one, never root's.
	FileCaps map[string][]uint
	// SubIDs gives the image's user the subordinate IDs SubIDFirst to
	// SubIDFirst+SubIDCount-1 in /etc/subuid and /etc/subgid.
	SubIDs bool
	// Scripts are the project's own files the image has in BinDir (name to
	// content, mode 0755), besides Binaries.
	Scripts map[string][]byte
	// Executables are programs of the peer's packages the image must
	// carry (paths in the image, without the leading slash; checked by
	// the image test), for images whose entrypoint is a script.
	Executables []string
	// Links are symbolic links (path in the image, without the leading
	// slash, to target) that the packages' maintainer scripts would make
	// (update-alternatives), which never run here.
	Links map[string]string
	// Cmd is the image's command (its entrypoint is Image.Binary's).
	Cmd []string
}

// The capabilities Peer.FileCaps gives (linux/capability.h).
const (
	CapSetGID = 6
	CapSetUID = 7
)

// The subordinate IDs of an image with Peer.SubIDs: 65536 from 100000, the
// range a rootless user namespace maps besides the user itself.
const (
	SubIDFirst = 100000
	SubIDCount = 65536
)

// Images are the images `make images` builds. functions/local has none: it
// is the one-machine quick start, whose process backend runs every executor
// as a process of the user on the host, so it is run from a checkout.
var Images = []Image{
	function("dispatch"),
	function("handle"),
	function("recover"),
	function("gateway"),
	// The runner alone, for injection into any job image: an init container
	// runs `runner install <path>` to copy it into a shared volume.
	function("runner"),
	// The runner with what ubuntu-latest's common workflows expect (bash,
	// git, curl, make, gcc, python3, zstd, git-lfs, Node.js 24, CA
	// certificates; README.md "The runner-host image"): host-mode jobs.
	// BuildKit's client too (scripts/peers/buildkit.sh), for a pool's build
	// capability.
	// The Docker CLI with its buildx and compose plugins (scripts/peers/docker.sh),
	// for a pool's docker capability.
	{Name: "runner-host", Package: "./functions/runner", Binary: "runner", Packages: true,
		Tools: []Tool{
			{Peer: "buildkit", Binary: "buildctl", Wrapper: buildctlWrapper},
			{Peer: "docker", Binary: "docker", Wrapper: dockerWrapper},
			{Peer: "docker", Binary: "docker-buildx", Dir: DockerPluginDir},
			{Peer: "docker", Binary: "docker-compose", Dir: DockerPluginDir},
		}},
	// Rootless BuildKit, a pool's build sidecar (scripts/peers/buildkit.sh):
	// buildkitd under RootlessKit, which maps the user's subordinate IDs
	// with newuidmap/newgidmap (Debian's uidmap; setuid root there, here
	// holding CAP_SETUID and CAP_SETGID alone as file capabilities: a
	// setuid-root newuidmap needs CAP_SYS_ADMIN where the container lacks
	// it) and runs Debian's runc for each RUN step; buildctl for the jobs'
	// steps.
	{Name: "buildkit", Binary: "rootlesskit", Peer: &Peer{
		Binaries: []string{"buildkitd", "buildctl", "rootlesskit"},
		FileCaps: map[string][]uint{"usr/bin/newuidmap": {CapSetUID}, "usr/bin/newgidmap": {CapSetGID}},
		SubIDs:   true,
		Cmd: []string{"buildkitd", "--rootless", "--oci-worker-no-process-sandbox",
			"--root", Home + "/.local/share/buildkit", "--addr", "unix:///run/buildkit/buildkitd.sock"},
	}},
	// Rootless Docker, a pool's docker sidecar (scripts/peers/docker.sh):
	// Debian trixie's dockerd under RootlessKit and slirp4netns, with
	// newuidmap/newgidmap holding CAP_SETUID and CAP_SETGID alone as file
	// capabilities (as in buildkit), started by gdr-dockerd; gdr-runc is
	// its OCI runtime (runc, each container given the sidecar's /proc).
	{Name: "docker", Binary: "gdr-dockerd", Peer: &Peer{
		FileCaps: map[string][]uint{"usr/bin/newuidmap": {CapSetUID}, "usr/bin/newgidmap": {CapSetGID}},
		SubIDs:   true,
		Scripts:  map[string][]byte{"gdr-dockerd": dockerdEntry, "gdr-runc": dockerRuntime},
		Executables: []string{"usr/sbin/dockerd", "usr/bin/containerd", "usr/bin/containerd-shim-runc-v2", "usr/sbin/runc",
			"usr/bin/rootlesskit", "usr/bin/slirp4netns", "usr/bin/nsenter", "usr/bin/mount", "usr/sbin/ip", "usr/bin/jq",
			"usr/bin/docker", "usr/sbin/xtables-nft-multi"},
		// dockerd's NAT for its bridges in RootlessKit's network namespace.
		Links: map[string]string{
			"usr/sbin/iptables": "xtables-nft-multi", "usr/sbin/iptables-save": "xtables-nft-multi", "usr/sbin/iptables-restore": "xtables-nft-multi",
			"usr/sbin/ip6tables": "xtables-nft-multi", "usr/sbin/ip6tables-save": "xtables-nft-multi", "usr/sbin/ip6tables-restore": "xtables-nft-multi",
		},
	}},
}

// DockerPluginDir is where runner-host's Docker CLI plugins are: a folder
// the Docker CLI looks in.
const DockerPluginDir = "/usr/local/libexec/docker/cli-plugins"

// The docker image's entrypoint and OCI runtime, and runner-host's docker
// wrapper (docker/: each file says what it does).
var (
	//go:embed docker/gdr-dockerd
	dockerdEntry []byte
	//go:embed docker/gdr-runc
	dockerRuntime []byte
	//go:embed docker/docker
	dockerWrapper string
)

func function(name string) Image {
	return Image{Name: name, Package: "./functions/" + name, Binary: name}
}

// Options say where the inputs are and where the images go.
type Options struct {
	// Module is the Go module's root folder, where `go build` runs.
	Module string
	// Out is the folder the layouts are written to, one folder each.
	Out string
	// Packages is the folder of Debian packages (scripts/debs.sh), with one
	// folder of .deb files per architecture and node/ (nodeTarballs).
	// Needed by images with
	// Packages, and for the CA bundle when CABundle is nil.
	Packages string
	// Peers are the folders of the images built from a peer, by image
	// name (Image.Peer).
	Peers map[string]string
	// CABundle, if not nil, is the CA bundle instead of the one generated
	// from the ca-certificates package (tests).
	CABundle []byte
	// Epoch is every file's modification time and the images' created time.
	Epoch time.Time
	// Platforms are the platforms each image is built for, a subset of
	// Platforms in its order (ParsePlatforms); empty: every one of Platforms.
	Platforms []Platform
	// Go is the go command ("go" when empty).
	Go string
	// Commit, when set, is stamped into every binary (shared/function's
	// stamp: what --version names), whatever the toolchain records itself.
	Commit string
	// Log gets the builder's progress and the go command's output.
	Log io.Writer
}

// Result is one image built.
type Result struct {
	Name string
	// Digest is the image index's digest.
	Digest v1.Hash
	// Platforms are the platforms of the image index, in its order
	// (Options.Platforms).
	Platforms []Platform
	// Manifests are the digests of the platform images, in Platforms order.
	Manifests []v1.Hash
	// Sizes are the compressed sizes (config and layers) of the platform
	// images, in Platforms order.
	Sizes []int64
}

// Build builds the images, one after the other, into Options.Out.
func Build(ctx context.Context, opts Options, images []Image) ([]Result, error) {
	if opts.Go == "" {
		opts.Go = "go"
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if len(opts.Platforms) == 0 {
		opts.Platforms = Platforms
	}
	for i, p := range opts.Platforms {
		at := slices.Index(Platforms, p)
		if at < 0 || i > 0 && at <= slices.Index(Platforms, opts.Platforms[i-1]) {
			return nil, fmt.Errorf("platforms %v: want a subset of %v in its order", opts.Platforms, Platforms)
		}
	}
	work, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return nil, fmt.Errorf("work folder: %w", err)
	}
	defer os.RemoveAll(work)
	b := &builder{opts: opts, work: work, layers: map[string]v1.Layer{}}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return nil, fmt.Errorf("output folder %s: %w", opts.Out, err)
	}
	var results []Result
	for _, img := range images {
		r, err := b.image(ctx, img)
		if err != nil {
			return results, fmt.Errorf("image %s: %w", img.Name, err)
		}
		results = append(results, r)
	}
	return results, nil
}

// builder builds images, sharing layers between them.
type builder struct {
	opts   Options
	work   string
	ca     []byte
	layers map[string]v1.Layer // by key: "base", "bin/<arch>/<binary>", "debs/<arch>"
}

// image builds one image and writes its layout.
func (b *builder) image(ctx context.Context, img Image) (Result, error) {
	r := Result{Name: img.Name, Platforms: b.opts.Platforms}
	var adds []mutate.IndexAddendum
	for _, p := range b.opts.Platforms {
		im, err := b.platformImage(ctx, img, p)
		if err != nil {
			return r, fmt.Errorf("%s: %w", p.Arch, err)
		}
		d, err := im.Digest()
		if err != nil {
			return r, fmt.Errorf("%s: %w", p.Arch, err)
		}
		size, err := imageSize(im)
		if err != nil {
			return r, fmt.Errorf("%s: %w", p.Arch, err)
		}
		r.Manifests = append(r.Manifests, d)
		r.Sizes = append(r.Sizes, size)
		adds = append(adds, mutate.IndexAddendum{Add: im, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: p.Arch, Variant: p.Variant},
		}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	d, err := idx.Digest()
	if err != nil {
		return r, err
	}
	r.Digest = d

	dir := filepath.Join(b.opts.Out, img.Name)
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return r, err
	}
	lp, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return r, fmt.Errorf("layout %s: %w", tmp, err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": RefName,
	})); err != nil {
		return r, fmt.Errorf("layout %s: %w", tmp, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return r, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return r, err
	}
	fmt.Fprintf(b.opts.Log, "imagebuild: %s: %s\n", dir, d)
	return r, nil
}

// imageSize is the compressed size of an image's config and layers.
func imageSize(im v1.Image) (int64, error) {
	m, err := im.Manifest()
	if err != nil {
		return 0, err
	}
	size := m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return size, nil
}

// platformImage is the image of one platform: the Debian packages (if any),
// the base files, then the binary, each a layer.
func (b *builder) platformImage(ctx context.Context, img Image, p Platform) (v1.Image, error) {
	var adds []mutate.Addendum
	add := func(l v1.Layer, what string) {
		adds = append(adds, mutate.Addendum{Layer: l, History: v1.History{
			Created:   v1.Time{Time: b.epoch()},
			CreatedBy: "gitea-dynamic-runner imagebuild: " + what,
		}})
	}
	if img.Packages {
		l, err := b.debsLayer(ctx, p.Arch)
		if err != nil {
			return nil, err
		}
		add(l, "Debian packages, Node.js and npm (scripts/debs.sh)")
	}
	if img.Peer != nil {
		l, err := b.peerDebsLayer(ctx, img, p.Arch)
		if err != nil {
			return nil, err
		}
		add(l, "the peer's Debian packages (scripts/peers/"+img.Name+".sh)")
	}
	l, err := b.baseLayer(ctx)
	if err != nil {
		return nil, err
	}
	add(l, "passwd, group, nsswitch.conf, CA certificates, /tmp, "+Home)
	var cmd []string
	if img.Peer != nil {
		if img.Peer.SubIDs {
			l, err := b.subIDsLayer()
			if err != nil {
				return nil, err
			}
			add(l, "/etc/subuid, /etc/subgid")
		}
		l, err = b.peerBinariesLayer(img, p.Arch)
		if err != nil {
			return nil, err
		}
		add(l, BinDir+"/{"+strings.Join(img.Peer.Binaries, ",")+"} (scripts/peers/"+img.Name+".sh)")
		cmd = img.Peer.Cmd
	} else {
		l, err = b.binaryLayer(ctx, img, p.Arch)
		if err != nil {
			return nil, err
		}
		add(l, BinDir+"/"+img.Binary+" ("+img.Package+")")
	}
	for _, tool := range img.Tools {
		l, err = b.toolLayer(tool, p.Arch)
		if err != nil {
			return nil, err
		}
		if tool.Dir != "" {
			add(l, tool.Dir+"/"+tool.Binary+" (scripts/peers/"+tool.Peer+".sh)")
			continue
		}
		add(l, ToolDir+"/"+tool.Binary+" (scripts/peers/"+tool.Peer+".sh), its wrapper "+BinDir+"/"+tool.Binary)
	}

	cfg := &v1.ConfigFile{
		Architecture: p.Arch,
		Variant:      p.Variant,
		OS:           "linux",
		Created:      v1.Time{Time: b.epoch()},
		Config: v1.Config{
			Entrypoint: []string{BinDir + "/" + img.Binary},
			Cmd:        cmd,
			User:       strconv.Itoa(UID) + ":" + strconv.Itoa(GID),
			Env: []string{
				"PATH=" + BinDir + ":/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
				"HOME=" + Home,
				"SSL_CERT_FILE=" + CABundle,
			},
			WorkingDir: "/",
			Labels: map[string]string{
				"org.opencontainers.image.title": "gitea-dynamic-runner-" + img.Name,
			},
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	im := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	im = mutate.ConfigMediaType(im, types.OCIConfigJSON)
	im, err = mutate.ConfigFile(im, cfg)
	if err != nil {
		return nil, err
	}
	return mutate.Append(im, adds...)
}

func (b *builder) epoch() time.Time { return b.opts.Epoch.UTC().Truncate(time.Second) }

// layer returns the layer cached under key, or writes it with fill.
func (b *builder) layer(key string, fill func(*tarLayer) error) (v1.Layer, error) {
	if l, ok := b.layers[key]; ok {
		return l, nil
	}
	path := filepath.Join(b.work, strings.ReplaceAll(key, "/", "_")+".tar.gz")
	tl, err := newTarLayer(path, b.epoch())
	if err != nil {
		return nil, err
	}
	if err := fill(tl); err != nil {
		tl.close()
		return nil, fmt.Errorf("layer %s: %w", key, err)
	}
	if err := tl.close(); err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromFile(path, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", key, err)
	}
	b.layers[key] = l
	return l, nil
}

// baseLayer has what every image has besides its binary: the user, name
// service configuration, the CA bundle, /tmp and the user's home.
func (b *builder) baseLayer(ctx context.Context) (v1.Layer, error) {
	ca, err := b.caBundle(ctx)
	if err != nil {
		return nil, err
	}
	return b.layer("base", func(l *tarLayer) error {
		uid, gid := strconv.Itoa(UID), strconv.Itoa(GID)
		files := []struct {
			name string
			mode int64
			data []byte
		}{
			{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
				UserName + ":x:" + uid + ":" + gid + ":" + UserName + ":" + Home + ":/sbin/nologin\n")},
			{"etc/group", 0o644, []byte("root:x:0:\n" + UserName + ":x:" + gid + ":\n")},
			{"etc/nsswitch.conf", 0o644, []byte("passwd: files\ngroup: files\nhosts: files dns\n")},
			{strings.TrimPrefix(CABundle, "/"), 0o644, ca},
		}
		for _, f := range files {
			if err := l.bytes(f.name, f.mode, f.data); err != nil {
				return err
			}
		}
		if err := l.dir("root", 0o700, 0, 0); err != nil {
			return err
		}
		if err := l.dir("tmp", 0o1777, 0, 0); err != nil {
			return err
		}
		return l.dir(strings.TrimPrefix(Home, "/"), 0o755, UID, GID)
	})
}

// caBundle is Options.CABundle, or the bundle generated from the
// ca-certificates package.
func (b *builder) caBundle(ctx context.Context) ([]byte, error) {
	if b.opts.CABundle != nil {
		return b.opts.CABundle, nil
	}
	if b.ca != nil {
		return b.ca, nil
	}
	debs, err := debFiles(b.opts.Packages, b.opts.Platforms[0].Arch) // ca-certificates is Architecture: all
	if err != nil {
		return nil, err
	}
	ca, err := caBundle(ctx, debs)
	if err != nil {
		return nil, err
	}
	b.ca = ca
	return ca, nil
}

// debsLayer has the file system trees of the Debian packages of arch, then
// Node.js and npm (addNode).
func (b *builder) debsLayer(ctx context.Context, arch string) (v1.Layer, error) {
	debs, err := debFiles(b.opts.Packages, arch)
	if err != nil {
		return nil, err
	}
	node, err := nodeTarballs(b.opts.Packages, arch)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(b.opts.Log, "imagebuild: %d Debian packages, %s and %s for %s\n", len(debs),
		filepath.Base(node.node), filepath.Base(node.npm), arch)
	return b.layer("debs/"+arch, func(l *tarLayer) error {
		if err := addDebs(ctx, l, debs); err != nil {
			return err
		}
		return addNode(l, node)
	})
}

// peerDir is the folder of the peer called name (an image's, Image.Peer, or
// a Tool's) for arch.
func (b *builder) peerDir(name, arch string) (string, error) {
	dir := b.opts.Peers[name]
	if dir == "" {
		return "", fmt.Errorf("no peer folder for %s (Options.Peers; make images: scripts/peers/%s.sh build)", name, name)
	}
	return filepath.Join(dir, arch), nil
}

// toolLayer has tool's binary for arch at ToolDir and its wrapper in BinDir.
func (b *builder) toolLayer(tool Tool, arch string) (v1.Layer, error) {
	dir, err := b.peerDir(tool.Peer, arch)
	if err != nil {
		return nil, err
	}
	return b.layer("tool/"+tool.Peer+"/"+tool.Binary+"/"+arch, func(l *tarLayer) error {
		if tool.Dir != "" {
			return l.copyFile(strings.TrimPrefix(tool.Dir, "/")+"/"+tool.Binary, 0o755, filepath.Join(dir, "bin", tool.Binary))
		}
		if err := l.copyFile(strings.TrimPrefix(ToolDir, "/")+"/"+tool.Binary, 0o755, filepath.Join(dir, "bin", tool.Binary)); err != nil {
			return err
		}
		return l.bytes(strings.TrimPrefix(BinDir, "/")+"/"+tool.Binary, 0o755, []byte(tool.Wrapper))
	})
}

// peerDebsLayer has the file system trees of the Debian packages of img's
// peer for arch, no file setuid, those img.Peer.FileCaps names with their
// file capabilities.
func (b *builder) peerDebsLayer(ctx context.Context, img Image, arch string) (v1.Layer, error) {
	dir, err := b.peerDir(img.Name, arch)
	if err != nil {
		return nil, err
	}
	debs, err := debFiles(dir, "debs")
	if err != nil {
		return nil, err
	}
	return b.layer("peer-debs/"+img.Name+"/"+arch, func(l *tarLayer) error {
		l.fileCaps = map[string][]uint{}
		for name, caps := range img.Peer.FileCaps {
			l.fileCaps[cleanName(name)] = caps
		}
		if err := addDebs(ctx, l, debs); err != nil {
			return err
		}
		// Packages of a merged-/usr release (trixie's) ship /usr/bin and
		// the loader's /usr/lib64 alone: the links base-files would make.
		for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
			if l.seen["usr/"+d] && !l.seen[d] {
				if err := l.symlink(d, "usr/"+d); err != nil {
					return err
				}
			}
		}
		for _, name := range slices.Sorted(maps.Keys(img.Peer.Links)) {
			target := img.Peer.Links[name]
			if !l.seen[cleanName(path.Join(path.Dir(name), target))] {
				return fmt.Errorf("link %s: no %s in the peer's packages", name, target)
			}
			if err := l.symlink(cleanName(name), target); err != nil {
				return err
			}
		}
		for name := range l.fileCaps {
			if !l.seen[name] {
				return fmt.Errorf("no %s in the peer's packages to give file capabilities", name)
			}
		}
		return nil
	})
}

// peerBinariesLayer has img.Peer.Binaries from its peer's folder for arch.
func (b *builder) peerBinariesLayer(img Image, arch string) (v1.Layer, error) {
	dir, err := b.peerDir(img.Name, arch)
	if err != nil {
		return nil, err
	}
	return b.layer("peer-bin/"+img.Name+"/"+arch, func(l *tarLayer) error {
		for _, bin := range img.Peer.Binaries {
			if err := l.copyFile(strings.TrimPrefix(BinDir, "/")+"/"+bin, 0o755, filepath.Join(dir, "bin", bin)); err != nil {
				return err
			}
		}
		for _, name := range slices.Sorted(maps.Keys(img.Peer.Scripts)) {
			if err := l.bytes(strings.TrimPrefix(BinDir, "/")+"/"+name, 0o755, img.Peer.Scripts[name]); err != nil {
				return err
			}
		}
		return nil
	})
}

// subIDsLayer has /etc/subuid and /etc/subgid giving the image's user
// SubIDCount IDs from SubIDFirst.
func (b *builder) subIDsLayer() (v1.Layer, error) {
	return b.layer("subids", func(l *tarLayer) error {
		line := []byte(fmt.Sprintf("%s:%d:%d\n", UserName, SubIDFirst, SubIDCount))
		if err := l.bytes("etc/subuid", 0o644, line); err != nil {
			return err
		}
		return l.bytes("etc/subgid", 0o644, line)
	})
}

// binaryLayer has the image's binary, compiled for arch.
func (b *builder) binaryLayer(ctx context.Context, img Image, arch string) (v1.Layer, error) {
	return b.layer("bin/"+arch+"/"+img.Binary+"/"+img.Package, func(l *tarLayer) error {
		bin, err := b.compile(ctx, img, arch)
		if err != nil {
			return err
		}
		return l.copyFile(strings.TrimPrefix(BinDir, "/")+"/"+img.Binary, 0o755, bin)
	})
}

// StampVariable is the variable the linker sets to Options.Commit.
const StampVariable = "github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function.stamp"

// compile builds the image's binary for linux/arch: static, -trimpath,
// without symbol tables, for the baseline of each architecture.
func (b *builder) compile(ctx context.Context, img Image, arch string) (string, error) {
	out := filepath.Join(b.work, "bin", arch, img.Binary)
	fmt.Fprintf(b.opts.Log, "imagebuild: go build %s for linux/%s\n", img.Package, arch)
	ldflags := "-s -w"
	if b.opts.Commit != "" {
		ldflags += " -X " + StampVariable + "=" + b.opts.Commit
	}
	cmd := exec.CommandContext(ctx, b.opts.Go, "build", "-trimpath", "-ldflags="+ldflags, "-o", out, img.Package)
	cmd.Dir = b.opts.Module
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOAMD64=v1", "GOARM64=v8.0")
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s for linux/%s: %w\n%s", img.Package, arch, err, output.String())
	}
	_, _ = b.opts.Log.Write(output.Bytes())
	return out, nil
}
