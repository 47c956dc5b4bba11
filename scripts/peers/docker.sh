#!/usr/bin/env bash
# scripts/peers/docker.sh: rootless Docker, the daemon a pool's executors may run as a sidecar
# (issue 45, a pool's docker capability), and the Docker CLI with its buildx and compose plugins
# for the runner-host image, all Debian trixie's packages, for the image architectures
# GDR_ARCHES names (default: this machine's; lib.sh image_arches).
#
#   docker.sh build   download once into ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/docker-26.1.5-v1/
#                     (every release architecture, amd64 and arm64) or docker-26.1.5-v1-<arch>/
#                     (GDR_ARCHES=<arch> alone), per architecture:
#                     <arch>/debs/*.deb   the dependency closure of DEBS (the docker image's root)
#                     <arch>/bin/{docker,docker-buildx,docker-compose}   the CLI and its plugins
#                     and print that folder (fast no-op when already built)
#   docker.sh path    print the folder if built, else exit 1
#
# Why trixie: bookworm's docker.io is 20.10 (API 1.41, past its end of life) and bookworm has no
# buildx and only the Python compose v1; trixie has docker.io 26.1, docker-buildx 0.13 and
# docker-compose 2.26, RootlessKit 2.0, slirp4netns 1.2. trixie's sources are derived from the
# machine's own Debian sources (same mirror, suite trixie, component main, the machine's Debian
# archive keyring). The CLI binaries need glibc 2.34 at most (checked below), so they run in the
# runner-host image, which is bookworm's (glibc 2.36).
# Nothing is installed or unpacked here: internal/imagebuild reads each .deb (maintainer scripts
# never run). Cold: about a minute (two package indexes, ~120 MB of .debs per architecture).
set -euo pipefail

DOCKER_VERSION=26.1.5
VERSION=1
# The sidecar's root: dockerd (docker.io pulls containerd, runc, tini, iptables), RootlessKit
# and slirp4netns (the daemon's own network namespace, see README "Docker workflows"), uidmap
# (newuidmap/newgidmap), iproute2 and util-linux (nsenter) for RootlessKit's tap, mount, a shell and coreutils
# for dockerd-rootless.sh, jq for gdr-runc.
DEBS=(docker.io docker-cli docker-buildx docker-compose rootlesskit slirp4netns uidmap iptables iproute2 util-linux mount jq dash coreutils)
CLI=(usr/bin/docker usr/libexec/docker/cli-plugins/docker-buildx usr/libexec/docker/cli-plugins/docker-compose)
PEER=docker-$DOCKER_VERSION-v$VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

built() {
  local arch b
  [ -f "$STAMP" ] || return 1
  for arch in "${ARCHES[@]}"; do
    for b in docker docker-buildx docker-compose; do [ -x "$DEST/$arch/bin/$b" ] || return 1; done
    compgen -G "$DEST/$arch/debs/docker.io_*.deb" >/dev/null || return 1
  done
}

# cli TMP ARCH: the CLI and its plugins out of TMP/ARCH/debs into TMP/ARCH/bin.
cli() {
  local tmp=$1 arch=$2 x=$1/x-$2 f glibc
  mkdir -p "$x" "$tmp/$arch/bin"
  dpkg-deb -x "$tmp/$arch/debs/"docker-cli_*.deb "$x"
  dpkg-deb -x "$tmp/$arch/debs/"docker-buildx_*.deb "$x"
  dpkg-deb -x "$tmp/$arch/debs/"docker-compose_*.deb "$x"
  for f in "${CLI[@]}"; do
    [ -x "$x/$f" ] || die "$arch: no $f in trixie's docker-cli, docker-buildx, docker-compose"
    cp "$x/$f" "$tmp/$arch/bin/"
    if [ "$arch" = amd64 ] && command -v objdump >/dev/null; then
      glibc=$(objdump -T "$x/$f" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)
      [ "$(printf '%s\nGLIBC_2.36\n' "$glibc" | sort -V | tail -1)" = GLIBC_2.36 ] ||
        die "$f needs $glibc, newer than bookworm's (the runner-host image's) glibc 2.36"
    fi
  done
  rm -rf "$x"
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v apt-get >/dev/null || die "apt-get not found: the docker image takes its packages from Debian"
  command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local arch
  trixie_sources "$(debian_sources)" "$tmp/trixie.sources"
  for arch in "${ARCHES[@]}"; do
    GDR_DEBIAN_SOURCES=$tmp/trixie.sources debs_closure "$tmp/apt-$arch" "$arch" "$tmp/$arch/debs" "${DEBS[@]}" >>"$tmp/packages.txt"
    cli "$tmp" "$arch"
  done
  grep -q "^docker.io $DOCKER_VERSION" "$tmp/packages.txt" || die "trixie's docker.io is not $DOCKER_VERSION: $(grep '^docker.io ' "$tmp/packages.txt")"
  {
    echo "docker=$DOCKER_VERSION"
    echo "debs=${DEBS[*]}"
    echo "arches=${ARCHES[*]}"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

image_arches "$PEER"
peer_main "$@"
