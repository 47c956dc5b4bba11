#!/usr/bin/env bash
# scripts/peers/kubectl.sh: the kubectl that deploy/README.md's install commands run in
# TestE2EClusterReadme* (deploy/readme_e2e_test.go), the same Kubernetes version as the test
# cluster (scripts/peers/kube.sh).
#
#   kubectl.sh build   build kubectl v1.37.2 once into
#                      ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/kubectl-v1.37.2/kubectl and
#                      print that folder (fast no-op when already built)
#   kubectl.sh path    print the folder if built, else exit 1
#
# The folder is complete exactly when it exists (scripts/peers/lib.sh). The project's go.mod is
# never touched: kubectl is built from kube.sh's throwaway module (scripts/peers/kube-module.sh:
# the same go.mod, so the same version of every shared package), with the machine's build cache
# (go env GOCACHE): after kube.sh (`make peers` runs it first) only what kubectl alone imports
# compiles, then it links; the client libraries it shares with the project's own builds compile
# once too. A separate peer, not one more command of kube.sh's `go build`: the shared cache gives
# the same sharing, and adding kubectl to kube.sh's folder would make every cached Kubernetes
# folder incomplete (a 15-30 min rebuild). Cold alone: ~2-7 min on 2 cores; after kube.sh: see
# docs/TESTING.md; warm: instant.
set -euo pipefail

# shellcheck source=kube-module.sh
. "$(dirname "${BASH_SOURCE[0]}")/kube-module.sh" # K8S_VERSION, kube_module
PEER=kubectl-$K8S_VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

built() { [ -f "$STAMP" ] && [ -x "$DEST/kubectl" ]; }

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local s

  export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  unset GOOS GOARCH || true
  kube_module "$tmp/mod" k8s.io/kubernetes/cmd/kubectl
  s=$(date +%s)
  say "compiling kubectl $K8S_VERSION"
  (cd "$tmp/mod" && go build -trimpath -ldflags "$KUBE_LDFLAGS" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl)
  rm -rf "$tmp/mod"
  grep -q "Client Version: $K8S_VERSION\$" <<<"$("$tmp/kubectl" version --client 2>/dev/null)" ||
    die "built kubectl does not report $K8S_VERSION"
  {
    echo "kubectl=$K8S_VERSION"
    echo "go=$(go env GOVERSION)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - s))"
  } >"$tmp/.complete"
  build_end
}

peer_main "$@"
