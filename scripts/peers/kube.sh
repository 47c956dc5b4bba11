#!/usr/bin/env bash
# scripts/peers/kube.sh: the real Kubernetes our end-to-end tests run against.
#
#   kube.sh build   build once, into ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/kube-v1.37.2/,
#                   etcd v3.7.0 and the Kubernetes v1.37.2 commands: kube-apiserver (the control
#                   plane of every e2e test), kube-scheduler, kube-controller-manager, kubelet and
#                   kube-proxy (the single-node cluster, internal/testenv/clusterenv; its container
#                   runtime comes from scripts/peers/kube-node.sh), and print that folder (fast
#                   no-op when already built)
#   kube.sh path    print the folder (KUBEBUILDER_ASSETS for controller-runtime envtest) if built,
#                   else exit 1
#
# The folder is complete exactly when it exists: it is assembled in a temporary sibling and
# renamed into place, with a stamp file written last. Concurrent builds are serialized by a
# lock file. The project's go.mod/go.sum are never touched: a throwaway module outside the
# checkout requires k8s.io/kubernetes and etcd's server module. k8s.io/kubernetes cannot be
# `go install`ed (it requires its staging repos at v0.0.0 and replaces them with ./staging
# paths that are not in the module zip), so the throwaway module replaces each staging repo
# with its published v0.<minor>.<patch>. CGO_ENABLED=0, -trimpath, a private build cache that
# is deleted afterwards (nothing a project build could reuse; ~2.8 GB).
# The five Kubernetes commands are compiled in ONE `go build` invocation, so the packages they
# share compile once: measured here, the API server alone took 768 s and the other three apart
# 900 s more, the four together 677 s (docs/CLUSTER.md).
# No kubectl: envtest only records its path and our tests never run it.
# Cold (empty module and build caches): ~92 MB of module downloads and 11-20 min on 2 cores.
# Warm (folder present): instant.
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.0
PEER=kube-$K8S_VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"


KUBE_COMMANDS=(kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy)

built() {
  [ -f "$STAMP" ] && [ -x "$DEST/etcd" ] || return 1
  local c
  for c in "${KUBE_COMMANDS[@]}"; do [ -x "$DEST/$c" ] || return 1; done
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local kmod staging gover minor patch sv ldflags vpkg

  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  patch=${K8S_VERSION##*.}
  sv=v0.$minor.$patch

  export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOCACHE=$tmp/gocache
  unset GOOS GOARCH || true
  mkdir "$tmp/mod"
  say "fetching k8s.io/kubernetes@$K8S_VERSION go.mod"
  kmod=$(cd "$tmp/mod" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$kmod" ] || die "go mod download k8s.io/kubernetes@$K8S_VERSION failed"
  staging=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$kmod" | sort -u)
  [ -n "$staging" ] || die "no staging requirements in $kmod"
  gover=$(awk '$1 == "go" {print $2; exit}' "$kmod")
  {
    echo "module gdr.local/kubepeer"
    echo
    echo "go $gover"
    echo
    echo "require ("
    echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo "	k8s.io/kubernetes $K8S_VERSION"
    echo ")"
    echo
    echo "replace ("
    for m in $staging; do printf '\t%s => %s %s\n' "$m" "$m" "$sv"; done
    echo ")"
  } >"$tmp/mod/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "go.etcd.io/etcd/server/v3"\n'
    for c in "${KUBE_COMMANDS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
    printf ')\n'
  } >"$tmp/mod/tools.go"

  # /version must report the real version (else v0.0.0-master): stamp it as k8s' own build does.
  ldflags="-s -w"
  for vpkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
  done
  (
    cd "$tmp/mod"
    local s c pkgs=()
    for c in "${KUBE_COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    s=$(date +%s)
    say "compiling ${KUBE_COMMANDS[*]} $K8S_VERSION (one go build)"
    go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}"
    echo "$(($(date +%s) - s))" >"$tmp/.kubernetes_seconds"
    say "kubernetes built in $(cat "$tmp/.kubernetes_seconds")s"
    s=$(date +%s)
    say "compiling etcd $ETCD_VERSION"
    go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
    say "etcd built in $(($(date +%s) - s))s"
  )
  chmod -R u+w "$tmp/gocache" && rm -rf "$tmp/gocache" "$tmp/mod"
  for c in "${KUBE_COMMANDS[@]}"; do
    grep -qx "Kubernetes $K8S_VERSION" <<<"$("$tmp/$c" --version 2>/dev/null)" || die "built $c does not report $K8S_VERSION"
  done
  # The output is read whole before grep sees it: grep -q in a pipe exits at its first match, and
  # under pipefail the writer's SIGPIPE would fail the check at random.
  grep -qx "etcd Version: ${ETCD_VERSION#v}" <<<"$("$tmp/etcd" --version 2>/dev/null)" ||
    die "built etcd does not report $ETCD_VERSION"
  {
    echo "kubernetes=$K8S_VERSION (${KUBE_COMMANDS[*]})"
    echo "etcd=$ETCD_VERSION"
    echo "go=$(go env GOVERSION)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "kubernetes_seconds=$(cat "$tmp/.kubernetes_seconds")"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  rm -f "$tmp/.kubernetes_seconds"
  build_end
}

peer_main "$@"
