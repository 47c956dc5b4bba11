// Command images builds the project's container images (`make images`):
// one OCI image layout per image under -out, each with an image per platform
// of -platforms (default: every one, linux/amd64 and linux/arm64, a
// release's; `make images` passes PLATFORMS, this machine's unless a release
// asks for all; see package imagebuild).
//
//	GDR_ARCHES=amd64 go run ./internal/imagebuild/cmd/images -platforms linux/amd64 -out bin/images \
//		-packages "$(GDR_ARCHES=amd64 scripts/debs.sh build)" -peer buildkit="$(GDR_ARCHES=amd64 scripts/peers/buildkit.sh build)"
//
// Every timestamp is SOURCE_DATE_EPOCH (seconds), which must be set: `make
// images` sets it to the commit's time.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/imagebuild"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "images: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("out", "bin/images", "folder the image layouts are written to, one folder each")
	packages := flag.String("packages", "", "folder of the Debian packages (scripts/debs.sh build prints it)")
	only := flag.String("only", "", "comma-separated image names to build (default: all)")
	commit := flag.String("commit", "", "the commit every binary's --version names (make images: the checkout's)")
	platformList := flag.String("platforms", "linux/amd64,linux/arm64", "comma-separated platforms to build each image for (the peer folders must hold them)")
	peers := map[string]string{}
	flag.Func("peer", "`image=folder`: the peer folder an image is built from (buildkit=$(scripts/peers/buildkit.sh build)); repeatable", func(v string) error {
		name, dir, ok := strings.Cut(v, "=")
		if !ok || name == "" || dir == "" {
			return fmt.Errorf("want image=folder, got %q", v)
		}
		peers[name] = dir
		return nil
	})
	flag.Parse()

	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return fmt.Errorf("SOURCE_DATE_EPOCH is not set (make images sets it to the commit's time)")
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
	}
	platforms, err := imagebuild.ParsePlatforms(*platformList)
	if err != nil {
		return fmt.Errorf("-platforms: %w", err)
	}
	images := imagebuild.Images
	if *only != "" {
		names := strings.Split(*only, ",")
		images = slices.DeleteFunc(slices.Clone(images), func(i imagebuild.Image) bool { return !slices.Contains(names, i.Name) })
		if len(images) != len(names) {
			return fmt.Errorf("-only %q: unknown image name", *only)
		}
	}
	module, err := os.Getwd()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	results, err := imagebuild.Build(ctx, imagebuild.Options{
		Module:    module,
		Out:       *out,
		Packages:  *packages,
		Epoch:     time.Unix(sec, 0),
		Commit:    *commit,
		Platforms: platforms,
		Peers:     peers,
		Log:       os.Stderr,
	}, images)
	if err != nil {
		return err
	}
	for _, r := range results {
		fmt.Printf("%-12s %s", r.Name, r.Digest)
		for i, p := range r.Platforms {
			fmt.Printf("  %s %s %.1f MB", p.Arch, r.Manifests[i].Hex[:12], float64(r.Sizes[i])/1e6)
		}
		fmt.Println()
	}
	return nil
}
