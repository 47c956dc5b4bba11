// Command release makes a release from `make images`' layouts and pushes it (package release):
//
//	go run ./internal/release/cmd/release make -version v0.2.0 -registry ghcr.io/gitea-dynamic-runner \
//		-images bin/images -chart deploy/helm/gitea-dynamic-runner -out bin/release/v0.2.0
//	go run ./internal/release/cmd/release push -dir bin/release/v0.2.0 -registry ghcr.io/gitea-dynamic-runner
//
// `make release` and `make push` run these. Every timestamp of the chart archive is
// SOURCE_DATE_EPOCH (seconds), which make sets to the commit's time.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/imagebuild"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/release"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("want a command: make or push")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	registry := fs.String("registry", "", "the registry and path the images are named under: <registry>/gitea-dynamic-runner-<name>")
	switch args[0] {
	case "make":
		version := fs.String("version", "", "the release's version, vMAJOR.MINOR.PATCH[-PRERELEASE]")
		images := fs.String("images", "bin/images", "make images' folder")
		chart := fs.String("chart", "deploy/helm/gitea-dynamic-runner", "the chart's folder")
		out := fs.String("out", "", "the release folder (empty or absent)")
		changelog := fs.String("changelog", "CHANGELOG.md", "the changelog: the version's section is the release's NOTES.md")
		var all []string
		for _, p := range imagebuild.Platforms {
			all = append(all, p.String())
		}
		platformList := fs.String("platforms", strings.Join(all, ","), "the platforms every image must hold, exactly (a release's: all of them; make release PLATFORMS=linux/amd64 makes one for that platform alone)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		epoch, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w (make release sets it to the commit's time)", os.Getenv("SOURCE_DATE_EPOCH"), err)
		}
		var names []string
		for _, i := range imagebuild.Images {
			names = append(names, i.Name)
		}
		parsed, err := imagebuild.ParsePlatforms(*platformList)
		if err != nil {
			return err
		}
		var platforms []string
		for _, p := range parsed {
			platforms = append(platforms, p.String())
		}
		m, err := release.Make(release.Options{Version: *version, Registry: *registry, Images: *images, Names: names,
			Platforms: platforms, Chart: *chart, Out: *out, Time: time.Unix(epoch, 0).UTC(), Changelog: *changelog})
		if err != nil {
			return err
		}
		fmt.Printf("release %s in %s: chart %s, %d images for %s\n", m.Version, *out, m.Chart, len(m.Images), m.Registry)
		return nil
	case "push":
		dir := fs.String("dir", "", "the release folder make wrote")
		plainHTTP := fs.Bool("plain-http", false, "talk HTTP, not HTTPS, to the registry")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		_, err := release.Push(ctx, *dir, release.PushOptions{Registry: *registry, PlainHTTP: *plainHTTP, Log: os.Stdout})
		return err
	}
	return fmt.Errorf("unknown command %q: want make or push", args[0])
}
