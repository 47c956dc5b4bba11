#!/usr/bin/env bash
# scripts/peers/gitea.sh: the real Gitea server our end-to-end tests run against.
#
#   gitea.sh build   build code.gitea.io/gitea once into
#                    ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/gitea-v1.27.3/{gitea,static/}
#                    and print that folder (fast no-op when already built)
#   gitea.sh path    print the binary path if built, else exit 1
#
# The folder is complete exactly when it exists: it is assembled in a temporary sibling and
# renamed into place, with a stamp file written last. Concurrent builds are serialized by a
# lock file. The project's go.mod/go.sum are never touched: Gitea's own module source is copied
# out of the module cache and built as the main module (GOWORK=off), with two workarounds:
#   - gitea.dev/* modules cannot be fetched through the module proxy; gitea.dev/actions-proto-go
#     is the same code as code.gitea.io/actions-proto-go at the same version (its go.mod already
#     says "module gitea.dev/actions-proto-go"), so a replace directive fixes it;
#   - gitea.dev/sdk is used only by the "migrate from another Gitea" downloader, which is dropped.
# No bindata and no frontend build: the binary reads options/, templates/ and public/ from
# static/ at run time (STATIC_ROOT_PATH). CGO_ENABLED=0 (pure-Go SQLite).
# Cold (empty module and build caches): ~420 MB of downloads and ~8 min on 2 cores; the
# folder is ~120 MB. Warm (folder present): instant.
set -euo pipefail

VERSION=v1.27.3
PEER=gitea-$VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"


built() { [ -f "$STAMP" ] && [ -x "$DEST/gitea" ] && [ -d "$DEST/static/options" ]; }

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local src dir
  src=$tmp/src

  say "fetching code.gitea.io/gitea@$VERSION into the module cache"
  # outside any module or workspace, so no go.mod is read or written
  dir=$(cd / && GOWORK=off GOFLAGS= go mod download -json "code.gitea.io/gitea@$VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] && [ -f "$dir/go.mod" ] || die "go mod download code.gitea.io/gitea@$VERSION failed"
  cp -r "$dir" "$src"
  chmod -R u+w "$src"

  (
    cd "$src"
    export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
    if grep -q '^[[:space:]]*gitea.dev/actions-proto-go ' go.mod; then
      v=$(sed -n 's/^[[:space:]]*gitea.dev\/actions-proto-go \(v[^ ]*\).*/\1/p' go.mod | head -1)
      go mod edit -replace "gitea.dev/actions-proto-go=code.gitea.io/actions-proto-go@$v"
    fi
    if grep -q '^[[:space:]]*gitea.dev/sdk ' go.mod; then
      go mod edit -droprequire gitea.dev/sdk
      rm -f services/migrations/gitea_downloader.go services/migrations/gitea_downloader_test.go
    fi
    say "compiling gitea (CGO_ENABLED=0, no bindata)"
    go build -trimpath -o "$tmp/gitea" \
      -ldflags "-s -w -X \"main.Version=${VERSION#v}\" -X \"main.Tags=\"" .
  )
  mkdir "$tmp/static"
  cp -r "$src/options" "$src/templates" "$src/public" "$tmp/static/"
  rm -rf "$src"
  "$tmp/gitea" --version >/dev/null 2>&1 || die "built binary does not run"
  {
    echo "version=$VERSION"
    echo "go=$(go env GOVERSION)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

PEER_PATH=$DEST/gitea
peer_main "$@"
