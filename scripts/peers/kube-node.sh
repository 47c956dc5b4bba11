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

sources() {
  if [ -n "${GDR_DEBIAN_SOURCES:-}" ]; then echo "$GDR_DEBIAN_SOURCES"
  elif [ -f /etc/apt/sources.list.d/debian.sources ]; then echo /etc/apt/sources.list.d/debian.sources
  elif [ -f /etc/apt/sources.list ]; then echo /etc/apt/sources.list
  else die "no Debian apt sources found (set GDR_DEBIAN_SOURCES)"
  fi
}

# runtime TMP: Debian's containerd, runc and CNI plugins into TMP/bin and TMP/cni.
runtime() {
  local tmp=$1 src state d
  src=$(sources)
  state=$tmp/apt
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/etc/sources.list.d" "$tmp/x" "$tmp/bin" "$tmp/cni"
  case "$src" in
    *.sources) cp "$src" "$state/etc/sources.list.d/debian.sources" ;;
    *) cp "$src" "$state/etc/sources.list.d/debian.list" ;;
  esac
  : >"$state/status"
  local opts=(
    -o "APT::Architecture=amd64" -o "APT::Architectures=amd64"
    -o "Dir::State=$state" -o "Dir::State::Lists=$state/lists" -o "Dir::State::status=$state/status"
    -o "Dir::Cache=$state/cache" -o "Dir::Cache::archives=$state/cache/archives"
    -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$state/etc/sources.list.d"
    -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=/dev/null"
    -o "APT::Sandbox::User=root" -o "Debug::NoLocking=true"
  )
  say "runtime: package indexes"
  apt-get "${opts[@]}" -qq update >&2
  say "runtime: downloading ${DEBS[*]}"
  (cd "$state/cache/archives" && apt-get "${opts[@]}" -qq download "${DEBS[@]}" >&2)
  for d in "$state/cache/archives/"*.deb; do
    dpkg-deb --show --showformat '${Package} ${Version} ${Architecture}\n' "$d" >>"$tmp/packages.txt"
    dpkg-deb -x "$d" "$tmp/x"
  done
  cp "$tmp/x/usr/bin/containerd" "$tmp/x/usr/bin/containerd-shim-runc-v2" "$tmp/x/usr/bin/ctr" "$tmp/bin/"
  cp "$tmp/x/usr/sbin/runc" "$tmp/bin/" 2>/dev/null || cp "$tmp/x/usr/bin/runc" "$tmp/bin/"
  cp "$tmp/x/usr/lib/cni/"* "$tmp/cni/"
  mkdir -p "$tmp/lib"
  cp "$tmp/x/usr/sbin/nft" "$tmp/bin/nft.real"
  cp -P "$tmp/x/usr/lib/x86_64-linux-gnu/"libnft* "$tmp/lib/"
  # The wrapper finds its libraries beside itself, wherever the folder is.
  printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/..\nLD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/nft.real" "$@"\n' >"$tmp/bin/nft"
  chmod 755 "$tmp/bin/nft"
  rm -rf "$tmp/x" "$state"
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

case "${1:-}" in
  build) build ;;
  path)
    if built; then echo "$DEST"; else exit 1; fi ;;
  *) die "usage: $0 build|path" ;;
esac
