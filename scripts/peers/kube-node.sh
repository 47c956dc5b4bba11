#!/usr/bin/env bash
# scripts/peers/kube-node.sh: the container runtime and packet filter of the single-node cluster
# (internal/testenv/clusterenv), beside the Kubernetes commands kube.sh builds (kube-apiserver,
# kube-scheduler, kube-controller-manager, kubelet, kube-proxy, all in its one `go build`).
#
#   kube-node.sh build   download once into
#                        ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/kube-node-v1.37.2/
#                          bin/{containerd,containerd-shim-runc-v2,ctr,runc}   containerd 1.6.20, runc 1.1.5
#                          cni/{bridge,host-local,loopback,portmap,...}        CNI plugins 1.1.1
#                          bin/nft (+ lib/)                                    nftables 1.0.6, for kube-proxy
#                        and print that folder (fast no-op when already built)
#   kube-node.sh path    print the folder if built, else exit 1
#
# Everything is Debian's (bookworm), downloaded with a private apt state (the machine's apt is
# untouched, nothing is installed) and extracted with dpkg-deb -x; only the binaries are kept.
# containerd and the CNI plugins are static Go binaries; runc links libseccomp (the machine's
# libseccomp2 is used); nft links libnftables1 and libnftnl11, which the machine lacks: they are
# kept in lib/ and bin/nft is a wrapper that points the loader there (kube-proxy's nftables mode
# runs `nft` from PATH; the machine has no nft and no iptables of its own).
# The folder is complete exactly when its stamp exists (temporary sibling, renamed into place,
# stamp written last); concurrent builds are serialized by a lock file.
set -euo pipefail

K8S_VERSION=v1.37.2
PEER=kube-node-$K8S_VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DEBS=(containerd runc containernetworking-plugins nftables libnftables1 libnftnl11)


built() {
  [ -f "$STAMP" ] || return 1
  local b
  for b in containerd containerd-shim-runc-v2 ctr runc nft nft.real; do
    [ -x "$DEST/bin/$b" ] || return 1
  done
  [ -x "$DEST/cni/bridge" ] && [ -x "$DEST/cni/host-local" ] && [ -x "$DEST/cni/loopback" ]
}

# runtime TMP: Debian's containerd, runc and CNI plugins into TMP/bin and TMP/cni.
runtime() {
  local tmp=$1
  mkdir -p "$tmp/bin" "$tmp/cni"
  debs_unpack "$tmp" "${DEBS[@]}"
  cp "$tmp/x/usr/bin/containerd" "$tmp/x/usr/bin/containerd-shim-runc-v2" "$tmp/x/usr/bin/ctr" "$tmp/bin/"
  cp "$tmp/x/usr/sbin/runc" "$tmp/bin/" 2>/dev/null || cp "$tmp/x/usr/bin/runc" "$tmp/bin/"
  cp "$tmp/x/usr/lib/cni/"* "$tmp/cni/"
  mkdir -p "$tmp/lib"
  cp "$tmp/x/usr/sbin/nft" "$tmp/bin/nft.real"
  cp -P "$tmp/x/usr/lib/x86_64-linux-gnu/"libnft* "$tmp/lib/"
  # The wrapper finds its libraries beside itself, wherever the folder is.
  printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/..\nLD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/nft.real" "$@"\n' >"$tmp/bin/nft"
  chmod 755 "$tmp/bin/nft"
  rm -rf "$tmp/x" "$tmp/apt"
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v apt-get >/dev/null || die "apt-get not found: the runtime comes from Debian's packages"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local s

  s=$(date +%s)
  runtime "$tmp"
  say "runtime downloaded in $(($(date +%s) - s))s"

  "$tmp/bin/nft" --version >/dev/null || die "bin/nft does not run"
  {
    echo "for=kubernetes $K8S_VERSION"
    cat "$tmp/packages.txt"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

peer_main "$@"
