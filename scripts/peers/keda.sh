#!/usr/bin/env bash
# scripts/peers/keda.sh: KEDA's operator, the autoscaler that starts handle Jobs from the shipped
# ScaledJob (deploy/keda/03-handle-pod.yaml) in our end-to-end tests.
#
#   keda.sh build   build KEDA v2.21.0's operator once into
#                   ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/keda-v2.21.0/keda-operator,
#                   copy KEDA's CRDs (config/crd/bases of the same module) into crds/ next to it,
#                   and print that folder (fast no-op when already built)
#   keda.sh path    print the folder if built, else exit 1
#
# The folder is complete exactly when it exists: it is assembled in a temporary sibling and
# renamed into place, with a stamp file written last. Concurrent builds are serialized by a
# lock file. The project's go.mod/go.sum are never touched: a throwaway module outside the
# checkout requires github.com/kedacore/keda/v2 from the Go module proxy and builds its
# cmd/operator. A dependent module does not inherit KEDA's replace and exclude directives: the
# throwaway module copies them from KEDA's go.mod. CGO_ENABLED=0, -trimpath, KEDA's own version
# stamp (version.Version, as its Makefile sets it; the module proxy records no commit, so
# version.GitCommit stays empty), the machine's build cache (go env GOCACHE: its keys cover
# CGO_ENABLED, tags and flags, so no peer's build can poison another's; the standard library and
# the modules KEDA shares with Kubernetes and the other peers compile once).
# Only the operator: ScaledJobs need neither KEDA's metrics API server nor its webhooks.
# Cold, measured on 2 shared cores (docs/CLUSTER.md): the module cache without KEDA's dependencies,
# 244 modules (655 MB) fetched and `go build` 2143 s under a load average of 14-23; the module cache
# warm, 915 s in all (go build 908 s) under a load average of ~5. 170 MB in the module cache (measured
# with a private build cache, since dropped). Warm (folder present): instant.
set -euo pipefail

KEDA_VERSION=v2.21.0
KEDA_MODULE=github.com/kedacore/keda/v2
PEER=keda-$KEDA_VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"


built() { [ -f "$STAMP" ] && [ -x "$DEST/keda-operator" ] && [ -f "$DEST/crds/keda.sh_scaledjobs.yaml" ]; }

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local info kmod kdir gover

  export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  unset GOOS GOARCH || true
  mkdir "$tmp/mod"
  say "fetching $KEDA_MODULE@$KEDA_VERSION"
  info=$(cd "$tmp/mod" && GOFLAGS= go mod download -json "$KEDA_MODULE@$KEDA_VERSION")
  kmod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' <<<"$info")
  kdir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$info")
  [ -f "$kmod" ] && [ -d "$kdir" ] || die "go mod download $KEDA_MODULE@$KEDA_VERSION failed"
  gover=$(awk '$1 == "go" {print $2; exit}' "$kmod")
  {
    echo "module gdr.local/kedapeer"
    echo
    echo "go $gover"
    echo
    echo "require $KEDA_MODULE $KEDA_VERSION"
    echo
    # KEDA's single-line replace and exclude directives (a block form would need more than this).
    grep -E '^(replace|exclude)[[:space:]]+[^(]' "$kmod" || true
  } >"$tmp/mod/go.mod"
  ! grep -qE '^(replace|exclude)[[:space:]]*\($' "$kmod" || die "$kmod has a replace/exclude block: copy it too"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd/operator"\n' "$KEDA_MODULE" >"$tmp/mod/tools.go"

  (
    cd "$tmp/mod"
    local s
    s=$(date +%s)
    say "compiling keda-operator $KEDA_VERSION"
    go build -trimpath -ldflags "-s -w -X $KEDA_MODULE/version.Version=${KEDA_VERSION#v}" \
      -o "$tmp/keda-operator" "$KEDA_MODULE/cmd/operator"
    say "keda-operator built in $(($(date +%s) - s))s"
  )
  mkdir "$tmp/crds"
  cp "$kdir"/config/crd/bases/*.yaml "$tmp/crds/"
  chmod 644 "$tmp"/crds/*.yaml
  rm -rf "$tmp/mod"
  # The main package's module is recorded as "mod" (not "dep"), though it is not the main module.
  grep -qE "^[[:space:]](mod|dep)[[:space:]]+$KEDA_MODULE[[:space:]]+$KEDA_VERSION([[:space:]]|$)" <<<"$(go version -m "$tmp/keda-operator")" ||
    die "built keda-operator does not embed $KEDA_MODULE $KEDA_VERSION"
  {
    echo "keda=$KEDA_VERSION"
    echo "go=$(go env GOVERSION)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

peer_main "$@"
