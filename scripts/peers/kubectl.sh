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
# never touched: a throwaway module outside the checkout requires k8s.io/kubernetes, whose
# staging requirements (v0.0.0, replaced by ./staging paths the module zip lacks) it replaces
# with their published v0.<minor>.<patch>, as kube.sh does; it builds k8s.io/kubernetes/cmd/kubectl
# alone, with the machine's build cache (the client libraries it shares with the project's own
# builds compile once). A separate peer, not one more command of kube.sh: adding it there would
# rebuild every cached Kubernetes folder. Cold: ~3-6 min on 2 cores; warm: instant.
set -euo pipefail

K8S_VERSION=v1.37.2
PEER=kubectl-$K8S_VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

built() { [ -f "$STAMP" ] && [ -x "$DEST/kubectl" ]; }

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local kmod staging gover minor patch sv ldflags vpkg m s

  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  patch=${K8S_VERSION##*.}
  sv=v0.$minor.$patch

  export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  unset GOOS GOARCH || true
  mkdir "$tmp/mod"
  kmod=$(cd "$tmp/mod" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$kmod" ] || die "go mod download k8s.io/kubernetes@$K8S_VERSION failed"
  staging=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$kmod" | sort -u)
  [ -n "$staging" ] || die "no staging requirements in $kmod"
  gover=$(awk '$1 == "go" {print $2; exit}' "$kmod")
  {
    printf 'module gdr.local/kubectlpeer\n\ngo %s\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$gover" "$K8S_VERSION"
    for m in $staging; do printf '\t%s => %s %s\n' "$m" "$m" "$sv"; done
    printf ')\n'
  } >"$tmp/mod/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubectl"\n' >"$tmp/mod/tools.go"

  # `kubectl version --client` must report the real version: stamp it as Kubernetes' build does.
  ldflags="-s -w"
  for vpkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
  done
  s=$(date +%s)
  say "compiling kubectl $K8S_VERSION"
  (cd "$tmp/mod" && go build -trimpath -ldflags "$ldflags" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl)
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
