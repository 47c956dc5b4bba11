#!/usr/bin/env bash
# scripts/debs.sh: the Debian packages the runner-host image carries (bash, git, node, CA
# certificates and what they depend on), downloaded once for linux/amd64 and linux/arm64.
#
#   debs.sh build   download the dependency closure of $PACKAGES for both architectures once into
#                   ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/debs-<codename>-v<N>/{amd64,arm64}/
#                   and print that folder (fast no-op when already there)
#   debs.sh path    print the folder if complete, else exit 1
#
# The machine's apt is not reconfigured: each architecture gets a private apt state (lists,
# cache, an empty dpkg status, so that `install --download-only` yields the whole closure rather
# than what this machine lacks) and `-o APT::Architecture=<arch>`. The sources are the machine's
# own Debian sources (/etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list; set
# GDR_DEBIAN_SOURCES to another deb822 or one-line file), signed by its Debian archive keyring:
# no other repository (a vendor's node for one architecture only, say) can slip in.
# Nothing is installed or unpacked here: internal/imagebuild reads each .deb with
# `dpkg-deb --fsys-tarfile` (maintainer scripts never run; the CA bundle is generated from the
# ca-certificates package's certificates).
#
# The folder is complete exactly when its stamp exists: it is assembled in a temporary sibling
# and renamed into place, the stamp written last; concurrent builds are serialized by a lock
# file. Bump VERSION when PACKAGES change. packages.txt lists "<name> <version> <arch>" per
# architecture: the exact closure an image was built from. A later download (after a Debian
# point or security release) may pick newer versions: remove the folder to refresh it.
# Cold: ~1-2 min (the package indexes of both architectures, then ~60 MB of .debs each).
set -euo pipefail

VERSION=1
PACKAGES=(bash dash coreutils git nodejs ca-certificates tar gzip findutils grep sed)
ARCHES=(amd64 arm64)
# shellcheck disable=SC1091
CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")
PEER=debs-$CODENAME-v$VERSION
# shellcheck source=peers/lib.sh
. "$(dirname "$0")/peers/lib.sh"

built() { [ -f "$STAMP" ]; }

# fetch ARCH TMP: the closure of PACKAGES for ARCH into TMP/ARCH, apt's state in TMP/apt-ARCH.
fetch() {
  local arch=$1 tmp=$2 state d
  state=$tmp/apt-$arch
  mkdir -p "$tmp/$arch"
  apt_private "$state" "$arch"
  say "$arch: downloading the closure of ${PACKAGES[*]}"
  apt-get "${APT_OPTS[@]}" -qq -y --download-only install "${PACKAGES[@]}" >&2
  mv "$state/cache/archives/"*.deb "$tmp/$arch/"
  for d in "$tmp/$arch/"*.deb; do
    dpkg-deb --show --showformat '${Package} ${Version} ${Architecture}\n' "$d"
  done | sort >>"$tmp/packages.txt"
  rm -rf "$state"
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v apt-get >/dev/null || die "apt-get not found: the runner-host image needs Debian's packages"
  command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local arch
  for arch in "${ARCHES[@]}"; do fetch "$arch" "$tmp"; done
  {
    echo "packages=${PACKAGES[*]}"
    echo "codename=$CODENAME"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

peer_main "$@"
