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
# lock file. The throwaway module outside the checkout (scripts/peers/kube-module.sh, shared with
# kubectl.sh) requires k8s.io/kubernetes and etcd's server module. CGO_ENABLED=0, -trimpath, the
# machine's build cache (go env GOCACHE): kubectl.sh, run after, finds every package it shares
# with the server commands compiled there (~2.8 GB of the cache; Go trims entries unused for
# five days).
# The five Kubernetes commands are compiled in ONE `go build` invocation, so the packages they
# share compile once: measured here, the API server alone took 768 s and the other three apart
# 900 s more, the four together 677 s (docs/CLUSTER.md).
# No kubectl here: envtest only records its path and our tests never run it; kubectl.sh builds it
# from the same module, so a kube folder built before it had kubectl stays complete.
# Cold (empty module and build caches): ~92 MB of module downloads and 11-20 min on 2 cores.
# Warm (folder present): instant.
set -euo pipefail

# shellcheck source=kube-module.sh
. "$(dirname "${BASH_SOURCE[0]}")/kube-module.sh" # K8S_VERSION, ETCD_VERSION, kube_module
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
  local c pkgs=()
  for c in "${KUBE_COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done

  export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  unset GOOS GOARCH || true
  kube_module "$tmp/mod" "${pkgs[@]}"
  (
    cd "$tmp/mod"
    local s
    s=$(date +%s)
    say "compiling ${KUBE_COMMANDS[*]} $K8S_VERSION (one go build)"
    go build -trimpath -ldflags "$KUBE_LDFLAGS" -o "$tmp/" "${pkgs[@]}"
    echo "$(($(date +%s) - s))" >"$tmp/.kubernetes_seconds"
    say "kubernetes built in $(cat "$tmp/.kubernetes_seconds")s"
    s=$(date +%s)
    say "compiling etcd $ETCD_VERSION"
    go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
    say "etcd built in $(($(date +%s) - s))s"
  )
  rm -rf "$tmp/mod"
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
