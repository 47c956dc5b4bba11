#!/usr/bin/env bash
# scripts/peers/helm.sh: the helm CLI that deploy/README.md's Helm commands run in
# TestE2EClusterHelmBuiltinIdentity (deploy/helm_e2e_test.go), the version of Helm's library the
# project's go.mod holds (the tests render and install the chart with it too).
#
#   helm.sh build   build helm v4.3.2 once into
#                   ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/helm-v4.3.2/helm and print
#                   that folder (fast no-op when already built)
#   helm.sh path    print the folder if built, else exit 1
#
# The folder is complete exactly when it exists (scripts/peers/lib.sh). `go install` of
# helm.sh/helm/v4/cmd/helm at that version, outside the checkout (its own go.mod, no replace
# directives), with the machine's build cache: the Kubernetes client libraries it shares with the
# project compile once. 82 s with that cache warm (from an empty one: not measured); built: instant.
set -euo pipefail

HELM_VERSION=v4.3.2
PEER=helm-$HELM_VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

built() { [ -f "$STAMP" ] && [ -x "$DEST/helm" ]; }

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local s
  export GOWORK=off GOFLAGS="-buildvcs=false" CGO_ENABLED=0
  unset GOOS GOARCH || true
  s=$(date +%s)
  say "compiling helm $HELM_VERSION"
  # `helm version` must report the real version: stamp it as Helm's Makefile does.
  (cd "$tmp" && GOBIN="$tmp" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION")
  grep -q "Version:\"$HELM_VERSION\"" <<<"$("$tmp/helm" version 2>/dev/null)" ||
    die "built helm does not report $HELM_VERSION: $("$tmp/helm" version 2>&1)"
  {
    echo "helm=$HELM_VERSION"
    echo "go=$(go env GOVERSION)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - s))"
  } >"$tmp/.complete"
  build_end
}

peer_main "$@"
