#!/usr/bin/env bash
# scripts/peers/spire.sh: the real SPIRE server (and agent) our end-to-end tests run against.
#
#   spire.sh build   build github.com/spiffe/spire/cmd/spire-server and cmd/spire-agent v1.13.3
#                    once into ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/spire-v1.13.3/
#                    and print that folder (fast no-op when already built)
#   spire.sh path    print the server's path if built, else exit 1
#
# spire-agent runs in a Pod of the single-node cluster (internal/testenv/clusterenv), from an
# image with nothing but the binary: it is static (CGO_ENABLED=0; the agent needs no cgo).
#
# The folder is complete exactly when it exists: it is assembled in a temporary sibling and
# renamed into place, with a stamp file written last. Concurrent builds are serialized by a
# lock file. The project's go.mod/go.sum are never touched: a throwaway tools module outside
# the checkout does `go get -tool github.com/spiffe/spire/cmd/spire-server@v1.13.3` and builds
# it. CGO stays enabled (the sqlite datastore is mattn/go-sqlite3), so a C compiler is needed.
# The machine's build cache (go env GOCACHE): its keys cover CGO_ENABLED, the C compiler and its
# flags, so the cgo server and the static agent never take each other's packages, nor another
# peer's; the standard library and the modules SPIRE shares with the other peers (gRPC, protobuf,
# the Kubernetes clients) compile once.
# Cold (empty module and build caches): ~11 min on 2 cores. Warm (folder present): instant.
set -euo pipefail

VERSION=v1.13.3
PEER=spire-$VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"


built() { [ -f "$STAMP" ] && [ -x "$DEST/spire-server" ] && [ -x "$DEST/spire-agent" ]; }

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  command -v cc >/dev/null || die "a C compiler (cc) is needed: spire-server's sqlite datastore uses cgo"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited

  export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=1
  unset GOOS GOARCH || true
  mkdir "$tmp/mod"
  (
    cd "$tmp/mod"
    go mod init gdr.local/spirepeer >/dev/null 2>&1
    say "resolving github.com/spiffe/spire/cmd/spire-server@$VERSION"
    go get -tool "github.com/spiffe/spire/cmd/spire-server@$VERSION"
    say "compiling spire-server $VERSION"
    go build -trimpath -ldflags "-s -w" -o "$tmp/spire-server" github.com/spiffe/spire/cmd/spire-server
    say "compiling spire-agent $VERSION (static)"
    go get -tool "github.com/spiffe/spire/cmd/spire-agent@$VERSION"
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/spire-agent" github.com/spiffe/spire/cmd/spire-agent
  )
  rm -rf "$tmp/mod"
  local b
  for b in spire-server spire-agent; do
    grep -q "${VERSION#v}" <<<"$("$tmp/$b" --version 2>&1)" || die "built $b does not report ${VERSION#v}"
  done
  {
    echo "spire-server=$VERSION"
    echo "spire-agent=$VERSION (static)"
    echo "go=$(go env GOVERSION)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

PEER_PATH=$DEST/spire-server
peer_main "$@"
