#!/usr/bin/env bash
# scripts/peers/kube-node.sh: the container runtime and packet filter of the single-node cluster
# (internal/testenv/clusterenv), beside the Kubernetes commands kube.sh builds (kube-apiserver,
# kube-scheduler, kube-controller-manager, kubelet, kube-proxy, all in its one `go build`).
#
#   kube-node.sh build   build once into
#                        ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/kube-node-v1.37.2-containerd-v2.4.2/
#                          bin/{containerd,containerd-shim-runc-v2,ctr}   containerd v2.4.2 (Go module proxy)
#                          bin/runc                                        runc v1.5.3 (Go module proxy)
#                          cni/{bridge,host-local,loopback,portmap,...}    CNI plugins 1.1.1 (Debian 12)
#                          bin/nft (+ lib/)                                nftables 1.0.6 (Debian 12), for kube-proxy
#                        and print that folder (fast no-op when already built)
#   kube-node.sh path    print the folder if built, else exit 1
#
# containerd 2 and runc 1.2 or later are what Kubernetes user namespaces (hostUsers: false) need:
# containerd reports them to the kubelet when runc lists idmapped mounts (Debian 12 has containerd
# 1.6 and runc 1.1.5, Debian 13 containerd 1.7 and runc 1.1.15). containerd is built as its
# Makefile does (CGO off; the shim without gRPC), with its own go.mod's versions (`go install
# pkg@version`); runc with cgo and libseccomp (a runc without seccomp refuses every container
# that has a profile), linked statically against Debian 12's libseccomp.a, so nothing it needs is
# missing on the machine; neither uses libpathrs or btrfs. Debian's packages are downloaded with a
# private apt state (the machine's apt is untouched, nothing is installed) and extracted with
# dpkg-deb -x. nft links libnftables1 and libnftnl11, which the machine lacks: they are kept in
# lib/ and bin/nft is a wrapper that points the loader there (kube-proxy's nftables mode runs
# `nft` from PATH). The machine's Go build cache is used, so what containerd shares with the
# other Go peers is compiled once. The folder is complete exactly when its stamp exists
# (temporary sibling, renamed into place, stamp written last); concurrent builds are serialized
# by a lock file.
set -euo pipefail

K8S_VERSION=v1.37.2
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
PEER=kube-node-$K8S_VERSION-containerd-$CONTAINERD_VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DEBS=(libseccomp-dev libseccomp2 containernetworking-plugins nftables libnftables1 libnftnl11)


built() {
  [ -f "$STAMP" ] || return 1
  local b
  for b in containerd containerd-shim-runc-v2 ctr runc nft nft.real; do
    [ -x "$DEST/bin/$b" ] || return 1
  done
  [ -x "$DEST/cni/bridge" ] && [ -x "$DEST/cni/host-local" ] && [ -x "$DEST/cni/loopback" ]
}

# runtime TMP: containerd and runc built into TMP/bin, Debian's CNI plugins into TMP/cni and nft
# with its libraries into TMP/bin and TMP/lib.
runtime() {
  local tmp=$1 s pc c=github.com/containerd/containerd/v2
  mkdir -p "$tmp/bin" "$tmp/cni" "$tmp/lib"
  debs_unpack "$tmp" "${DEBS[@]}"
  export GOWORK=off GOFLAGS=-buildvcs=false GOBIN=$tmp/bin GOOS=linux GOARCH=amd64

  pc=$tmp/x/usr/lib/x86_64-linux-gnu/pkgconfig
  sed -i "s|^prefix=.*|prefix=$tmp/x/usr|" "$pc/libseccomp.pc"
  s=$(date +%s)
  say "compiling runc $RUNC_VERSION (cgo, seccomp, static)"
  PKG_CONFIG_PATH=$pc CGO_ENABLED=1 go install -trimpath -tags "seccomp urfave_cli_no_docs netgo osusergo" \
    -ldflags "-X main.gitCommit=$RUNC_VERSION -linkmode external -extldflags -static" \
    "github.com/opencontainers/runc@$RUNC_VERSION"
  say "runc built in $(($(date +%s) - s))s"

  s=$(date +%s)
  say "compiling containerd $CONTAINERD_VERSION"
  local ld="-s -w -X $c/version.Version=$CONTAINERD_VERSION -X $c/version.Revision=module-proxy -X $c/version.Package=$c"
  local tags="no_btrfs no_zfs no_devmapper urfave_cli_no_docs"
  CGO_ENABLED=0 go install -trimpath -tags "$tags" -ldflags "$ld" "$c/cmd/containerd@$CONTAINERD_VERSION" "$c/cmd/ctr@$CONTAINERD_VERSION"
  CGO_ENABLED=0 go install -trimpath -tags "$tags no_grpc" -ldflags "$ld" "$c/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
  say "containerd built in $(($(date +%s) - s))s"
  {
    echo "containerd $CONTAINERD_VERSION (module proxy)"
    echo "runc $RUNC_VERSION (module proxy)"
  } >>"$tmp/packages.txt"

  cp "$tmp/x/usr/lib/cni/"* "$tmp/cni/"
  cp "$tmp/x/usr/sbin/nft" "$tmp/bin/nft.real"
  cp -P "$tmp/x/usr/lib/x86_64-linux-gnu/"libnft* "$tmp/lib/"
  # The wrapper finds its libraries beside itself, wherever the folder is.
  printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/..\nLD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/nft.real" "$@"\n' >"$tmp/bin/nft"
  chmod 755 "$tmp/bin/nft"
  rm -rf "$tmp/x" "$tmp/apt"
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v apt-get >/dev/null || die "apt-get not found: the CNI plugins and nft come from Debian's packages"
  command -v go >/dev/null || die "go not found: containerd and runc are built from the Go module proxy"
  command -v gcc >/dev/null && command -v pkg-config >/dev/null || die "gcc and pkg-config are needed: runc links libseccomp"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local s

  s=$(date +%s)
  runtime "$tmp"
  say "runtime built in $(($(date +%s) - s))s"

  "$tmp/bin/nft" --version >/dev/null || die "bin/nft does not run"
  "$tmp/bin/runc" --version | grep -q "^libseccomp: " || die "bin/runc has no seccomp"
  "$tmp/bin/runc" features | grep -q '"idmap"' || die "bin/runc lists no idmapped mounts"
  "$tmp/bin/containerd" --version | grep -qF " $CONTAINERD_VERSION " || die "bin/containerd is not $CONTAINERD_VERSION"
  {
    echo "for=kubernetes $K8S_VERSION"
    cat "$tmp/packages.txt"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

peer_main "$@"
