#!/usr/bin/env bash
# scripts/peers/buildkit.sh: rootless BuildKit, the image builder a pool's executors may run as a
# sidecar (issue 34): BuildKit's daemon and client and RootlessKit, built from the Go module
# proxy, and Debian's runc and uidmap (newuidmap/newgidmap) with what they link, for the image
# architectures GDR_ARCHES names (default: this machine's; lib.sh image_arches).
#
#   buildkit.sh build   build once into ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/buildkit-v0.34.2/
#                       (every release architecture, amd64 and arm64) or buildkit-v0.34.2-<arch>/
#                       (GDR_ARCHES=<arch> alone) <arch>/bin/{buildkitd,buildctl,rootlesskit} and
#                       <arch>/debs/*.deb per architecture, and print that folder (fast no-op when
#                       already built)
#   buildkit.sh path    print the folder if built, else exit 1
#
# The folder is complete exactly when its stamp exists (lib.sh). The project's go.mod/go.sum are
# never touched: a throwaway module outside the checkout requires BuildKit and RootlessKit from
# the Go module proxy and builds their commands; a dependent module does not inherit BuildKit's
# exclude directives, so the throwaway module copies BuildKit's exclude block. CGO_ENABLED=0,
# -trimpath, the build tags BuildKit's own release uses for its static binaries (osusergo netgo
# static_build), the machine's build cache (go env GOCACHE: its keys cover GOOS, GOARCH, tags and
# flags, so nothing here can be mistaken for another build's; the standard library and the
# modules other peers share compile once).
# runc is not built here: it needs cgo (its nsenter) and libseccomp, and BuildKit gives every RUN
# step a seccomp profile, which a runc built without seccomp refuses; Debian's runc (1.1.5, the
# test node's own) is linked with libseccomp2. newuidmap/newgidmap are setuid helpers RootlessKit
# needs to map the sidecar's user's subordinate IDs (no single-ID mode: a build unpacks files of
# other owners). The .debs are the dependency closure of runc and uidmap, downloaded with a
# private apt state (lib.sh apt_private) from the machine's Debian sources; nothing is installed.
# Cold, measured on 2 shared cores: the module cache without BuildKit's dependencies, ~150 s per
# architecture for go build (amd64 measured: 153 s for the three commands); the whole script
# (docs/TESTING.md) 1,905 s for two architectures under load, one architecture: see there.
set -euo pipefail

BUILDKIT_VERSION=v0.34.2
BUILDKIT_MODULE=github.com/moby/buildkit
ROOTLESSKIT_VERSION=v2.3.6
ROOTLESSKIT_MODULE=github.com/rootless-containers/rootlesskit/v2
DEBS=(runc uidmap)
PEER=buildkit-$BUILDKIT_VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

built() {
  local arch
  [ -f "$STAMP" ] || return 1
  for arch in "${ARCHES[@]}"; do
    [ -x "$DEST/$arch/bin/buildkitd" ] && [ -x "$DEST/$arch/bin/buildctl" ] && [ -x "$DEST/$arch/bin/rootlesskit" ] || return 1
  done
}

# module TMP: the throwaway module in TMP/mod requiring BuildKit and RootlessKit.
module() {
  local tmp=$1 info bmod gover
  mkdir "$tmp/mod"
  say "fetching $BUILDKIT_MODULE@$BUILDKIT_VERSION"
  info=$(cd "$tmp/mod" && GOFLAGS= go mod download -json "$BUILDKIT_MODULE@$BUILDKIT_VERSION")
  bmod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' <<<"$info")
  [ -f "$bmod" ] || die "go mod download $BUILDKIT_MODULE@$BUILDKIT_VERSION failed"
  ! grep -qE '^replace' "$bmod" || die "$bmod has replace directives: copy them too"
  gover=$(awk '$1 == "go" {print $2; exit}' "$bmod")
  {
    echo "module gdr.local/buildkitpeer"
    echo
    echo "go $gover"
    echo
    echo "require ("
    echo "	$BUILDKIT_MODULE $BUILDKIT_VERSION"
    echo "	$ROOTLESSKIT_MODULE $ROOTLESSKIT_VERSION"
    echo ")"
    echo
    # BuildKit's exclude directives, single lines and blocks alike.
    awk '/^exclude[[:space:]]*\($/ {b=1} b {print} b && /^\)$/ {b=0; next} !b && /^exclude[[:space:]]+[^(]/ {print}' "$bmod"
  } >"$tmp/mod/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/cmd/buildkitd"\n\t_ "%s/cmd/buildctl"\n\t_ "%s/cmd/rootlesskit"\n)\n' \
    "$BUILDKIT_MODULE" "$BUILDKIT_MODULE" "$ROOTLESSKIT_MODULE" >"$tmp/mod/tools.go"
  (cd "$tmp/mod" && go mod tidy -e >&2)
}

# compile TMP ARCH: the three commands into TMP/ARCH/bin.
compile() {
  local tmp=$1 arch=$2 s bin
  mkdir -p "$tmp/$arch/bin"
  s=$(date +%s)
  say "$arch: compiling buildkitd, buildctl ($BUILDKIT_VERSION) and rootlesskit ($ROOTLESSKIT_VERSION)"
  (cd "$tmp/mod" && GOOS=linux GOARCH=$arch go build -trimpath -tags "osusergo netgo static_build" \
    -ldflags "-s -w -X $BUILDKIT_MODULE/version.Version=$BUILDKIT_VERSION -X $BUILDKIT_MODULE/version.Package=$BUILDKIT_MODULE" \
    -o "$tmp/$arch/bin/" "$BUILDKIT_MODULE/cmd/buildkitd" "$BUILDKIT_MODULE/cmd/buildctl" "$ROOTLESSKIT_MODULE/cmd/rootlesskit")
  say "$arch: built in $(($(date +%s) - s))s"
  for bin in buildkitd buildctl; do
    grep -qE "^[[:space:]](mod|dep)[[:space:]]+$BUILDKIT_MODULE[[:space:]]+$BUILDKIT_VERSION([[:space:]]|$)" <<<"$(go version -m "$tmp/$arch/bin/$bin")" ||
      die "built $bin does not embed $BUILDKIT_MODULE $BUILDKIT_VERSION"
  done
}

# debs TMP ARCH: the closure of DEBS for ARCH into TMP/ARCH/debs.
debs() {
  debs_closure "$1/apt-$2" "$2" "$1/$2/debs" "${DEBS[@]}" >>"$1/packages.txt"
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  command -v apt-get >/dev/null || die "apt-get not found: the BuildKit image takes runc and uidmap from Debian"
  command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local arch
  export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  module "$tmp"
  for arch in "${ARCHES[@]}"; do
    compile "$tmp" "$arch"
    debs "$tmp" "$arch"
  done
  rm -rf "$tmp/mod"
  {
    echo "buildkit=$BUILDKIT_VERSION"
    echo "arches=${ARCHES[*]}"
    echo "rootlesskit=$ROOTLESSKIT_VERSION"
    echo "debs=${DEBS[*]}"
    echo "go=$(go env GOVERSION)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

image_arches "$PEER"
peer_main "$@"
