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
ROOT=${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}
# shellcheck disable=SC1091
CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")
DEST=$ROOT/debs-$CODENAME-v$VERSION
STAMP=$DEST/.complete

say() { echo "debs.sh: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

built() { [ -f "$STAMP" ]; }

sources() {
  if [ -n "${GDR_DEBIAN_SOURCES:-}" ]; then echo "$GDR_DEBIAN_SOURCES"
  elif [ -f /etc/apt/sources.list.d/debian.sources ]; then echo /etc/apt/sources.list.d/debian.sources
  elif [ -f /etc/apt/sources.list ]; then echo /etc/apt/sources.list
  else die "no Debian apt sources found (set GDR_DEBIAN_SOURCES)"
  fi
}

# fetch ARCH TMP: the closure of PACKAGES for ARCH into TMP/ARCH, apt's state in TMP/apt-ARCH.
fetch() {
  local arch=$1 tmp=$2 src state
  src=$(sources)
  state=$tmp/apt-$arch
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/etc/sources.list.d" "$state/etc/preferences.d" "$tmp/$arch"
  case "$src" in
    *.sources) cp "$src" "$state/etc/sources.list.d/debian.sources" ;;
    *) cp "$src" "$state/etc/sources.list.d/debian.list" ;;
  esac
  : >"$state/status"
  local opts=(
    -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
    -o "Dir::State=$state" -o "Dir::State::Lists=$state/lists" -o "Dir::State::status=$state/status"
    -o "Dir::Cache=$state/cache" -o "Dir::Cache::archives=$state/cache/archives"
    -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$state/etc/sources.list.d"
    -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$state/etc/preferences.d"
    -o "APT::Install-Recommends=false" -o "APT::Install-Suggests=false"
    -o "APT::Sandbox::User=root" -o "Debug::NoLocking=true"
  )
  say "$arch: package indexes"
  apt-get "${opts[@]}" -qq update >&2
  say "$arch: downloading the closure of ${PACKAGES[*]}"
  apt-get "${opts[@]}" -qq -y --download-only install "${PACKAGES[@]}" >&2
  mv "$state/cache/archives/"*.deb "$tmp/$arch/"
  local d
  for d in "$tmp/$arch/"*.deb; do
    dpkg-deb --show --showformat '${Package} ${Version} ${Architecture}\n' "$d"
  done | sort >>"$tmp/packages.txt"
  rm -rf "$state"
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v apt-get >/dev/null || die "apt-get not found: the runner-host image needs Debian's packages"
  command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
  mkdir -p "$ROOT"
  exec 9>"$ROOT/.debs-$CODENAME-v$VERSION.lock"
  flock 9
  if built; then echo "$DEST"; return 0; fi # another build finished while we waited

  local t0 tmp arch
  t0=$(date +%s)
  rm -rf "$ROOT/.debs-$CODENAME-v$VERSION.tmp."* # we hold the lock: leftovers of killed builds
  tmp=$(mktemp -d "$ROOT/.debs-$CODENAME-v$VERSION.tmp.XXXXXX")
  chmod 755 "$tmp"
  # shellcheck disable=SC2064 # expand now: remove exactly this temp dir on any exit
  trap "rm -rf '$tmp'" EXIT
  for arch in "${ARCHES[@]}"; do fetch "$arch" "$tmp"; done
  {
    echo "packages=${PACKAGES[*]}"
    echo "codename=$CODENAME"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  rm -rf "$DEST" # a leftover without a stamp is not complete
  mv "$tmp" "$DEST"
  trap - EXIT
  say "downloaded in $(($(date +%s) - t0))s, $(du -sh "$DEST" | cut -f1)"
  echo "$DEST"
}

case "${1:-}" in
  build) build ;;
  path)
    if built; then echo "$DEST"; else exit 1; fi ;;
  *) die "usage: $0 build|path" ;;
esac
