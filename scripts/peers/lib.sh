# scripts/peers/lib.sh: what every peer script shares; sourced, never run.
#
# A peer is built once into a versioned folder, $DEST = $ROOT/$PEER, which is complete exactly
# when it exists: it is assembled in a temporary sibling and renamed into place with its stamp
# file ($STAMP) written last, so a killed build leaves no folder that looks built. Concurrent
# builds of one peer are serialized by a lock file beside it.
#
# The sourcing script sets PEER (the folder's name, with its version) first and defines built()
# (true when $DEST holds everything) after, and ends with `peer_main "$@"`. Its build() runs:
#
#   if built; then echo "$DEST"; return 0; fi
#   <its own tool checks>
#   build_begin || { echo "$DEST"; return 0; }  # lock; false when another build finished meanwhile
#   <build into $tmp, write $tmp/.complete last>
#   build_end                                   # rename into place, print $DEST
#
# shellcheck shell=bash

ROOT=${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}
DEST=$ROOT/$PEER
STAMP=$DEST/.complete

say() { echo "${0##*/}: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

# build_begin takes the peer's lock (held until the script exits), then returns 1 if another
# build finished while it waited; else it sets t0 and tmp, a fresh temporary sibling of $DEST
# removed on any exit until build_end, after removing the leftovers of killed builds.
build_begin() {
  mkdir -p "$ROOT"
  exec 9>"$ROOT/.$PEER.lock"
  flock 9
  if built; then return 1; fi
  t0=$(date +%s)
  rm -rf "$ROOT/.$PEER.tmp."* # we hold the lock: these are leftovers of killed builds
  tmp=$(mktemp -d "$ROOT/.$PEER.tmp.XXXXXX")
  chmod 755 "$tmp" # mktemp makes it private; the finished folder is shared read-only
  # shellcheck disable=SC2064 # expand now: remove exactly this temp dir on any exit
  trap "chmod -R u+w '$tmp' 2>/dev/null; rm -rf '$tmp'" EXIT
}

# build_end renames $tmp into place as $DEST and prints $DEST.
build_end() {
  [ -f "$tmp/.complete" ] || die "internal: $tmp/.complete not written"
  rm -rf "$DEST" # a leftover without a stamp is not complete
  mv "$tmp" "$DEST"
  trap - EXIT
  say "built $PEER in $(($(date +%s) - t0))s, $(du -sh "$DEST" | cut -f1)"
  echo "$DEST"
}

# RELEASE_ARCHES are the architectures of a release's images (internal/imagebuild's Platforms),
# in index order.
RELEASE_ARCHES=(amd64 arm64)

# image_arches BASE: for a peer of the images (scripts/debs.sh, buildkit.sh, docker.sh), sets
# ARCHES, the architectures to build for, from GDR_ARCHES (comma- or space-separated Debian/Go
# architecture names; `make images` passes its PLATFORMS; default: this machine's, as dpkg names
# it), each one of RELEASE_ARCHES, in their order. The folder's name says what it holds: BASE
# holds every one of RELEASE_ARCHES (what `make release` needs), BASE-<arch>[-<arch>] only
# those; a folder of fewer never takes BASE's name. When BASE is built it serves any subset, so
# a machine that made a release builds nothing more for its tests. Call it after built() is
# defined: it sets PEER, DEST and STAMP again.
image_arches() {
  local base=$1 a want
  want=" $(tr ',' ' ' <<<"${GDR_ARCHES:-$(dpkg --print-architecture)}") "
  for a in $want; do
    [[ " ${RELEASE_ARCHES[*]} " == *" $a "* ]] || die "GDR_ARCHES: architecture $a is not one of ${RELEASE_ARCHES[*]}"
  done
  ARCHES=()
  for a in "${RELEASE_ARCHES[@]}"; do
    if [[ "$want" == *" $a "* ]]; then ARCHES+=("$a"); fi
  done
  [ "${#ARCHES[@]}" -gt 0 ] || die "GDR_ARCHES names no architecture"
  if [ "${ARCHES[*]}" = "${RELEASE_ARCHES[*]}" ]; then
    PEER=$base
  else
    PEER=$base-$(IFS=-; echo "${ARCHES[*]}")
    DEST=$ROOT/$base STAMP=$ROOT/$base/.complete
    if built; then return 0; fi # every release architecture, these among them
  fi
  DEST=$ROOT/$PEER
  STAMP=$DEST/.complete
}

# peer_main ARGS: the command line of every peer script: `build` (once; prints the folder) or
# `path` (prints $PEER_PATH, default $DEST, if built; else exits 1).
peer_main() {
  case "${1:-}" in
    build) build ;;
    path)
      if built; then echo "${PEER_PATH:-$DEST}"; else exit 1; fi ;;
    *) die "usage: $0 build|path" ;;
  esac
}

# trixie_sources SRC OUT: writes to OUT a deb822 sources file for `trixie main` on the first
# Debian mirror SRC (deb822 or one-line format) names for a non-security suite.
trixie_sources() {
  local src=$1 out=$2 uri
  case "$src" in
    *.sources)
      uri=$(awk '/^URIs:/ {u=$2} /^Suites:/ {if ($0 !~ /-security/ && u != "") {print u; exit}} /^$/ {u=""}' "$src") ;;
    *)
      uri=$(awk '$1 == "deb" && $0 !~ /-security/ {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' "$src") ;;
  esac
  [ -n "$uri" ] || die "no Debian mirror found in $src (set GDR_DEBIAN_SOURCES)"
  printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" >"$out"
}

# debian_sources prints the machine's Debian apt sources file (GDR_DEBIAN_SOURCES: another
# deb822 or one-line file), signed by its Debian archive keyring.
debian_sources() {
  if [ -n "${GDR_DEBIAN_SOURCES:-}" ]; then echo "$GDR_DEBIAN_SOURCES"
  elif [ -f /etc/apt/sources.list.d/debian.sources ]; then echo /etc/apt/sources.list.d/debian.sources
  elif [ -f /etc/apt/sources.list ]; then echo /etc/apt/sources.list
  else die "no Debian apt sources found (set GDR_DEBIAN_SOURCES)"
  fi
}

# apt_private STATE ARCH: sets APT_OPTS, the options that make apt-get use a private state in
# STATE (lists, cache, an empty dpkg status, the machine's Debian sources, no recommends) for
# ARCH, and fetches the package indexes: the machine's own apt is neither read nor written, and
# nothing is installed.
apt_private() {
  local state=$1 arch=$2 src
  src=$(debian_sources)
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/etc/sources.list.d" "$state/etc/preferences.d"
  case "$src" in
    *.sources) cp "$src" "$state/etc/sources.list.d/debian.sources" ;;
    *) cp "$src" "$state/etc/sources.list.d/debian.list" ;;
  esac
  : >"$state/status"
  APT_OPTS=(
    -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
    -o "Dir::State=$state" -o "Dir::State::Lists=$state/lists" -o "Dir::State::status=$state/status"
    -o "Dir::Cache=$state/cache" -o "Dir::Cache::archives=$state/cache/archives"
    -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$state/etc/sources.list.d"
    -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$state/etc/preferences.d"
    -o "APT::Install-Recommends=false" -o "APT::Install-Suggests=false"
    -o "APT::Sandbox::User=root" -o "Debug::NoLocking=true"
  )
  say "$arch: package indexes"
  apt-get "${APT_OPTS[@]}" -qq update >&2
}

# debs_closure STATE ARCH OUT PKG...: downloads the dependency closure of the Debian packages PKG
# for ARCH into the folder OUT (created), with a private apt state in STATE (removed afterwards),
# and prints "<package> <version> <arch>" per .deb, sorted. Nothing is installed or unpacked.
debs_closure() {
  local state=$1 arch=$2 out=$3 d
  shift 3
  apt_private "$state" "$arch"
  say "$arch: downloading the closure of $*"
  apt-get "${APT_OPTS[@]}" -qq -y --download-only install "$@" >&2
  mkdir -p "$out"
  mv "$state/cache/archives/"*.deb "$out/"
  for d in "$out/"*.deb; do
    dpkg-deb --show --showformat '${Package} ${Version} ${Architecture}\n' "$d"
  done | sort
  rm -rf "$state"
}

# debs_unpack TMP PKG...: downloads the Debian packages PKG (amd64; each alone, not its
# dependencies) with a private apt state in TMP/apt, unpacks each into TMP/x (maintainer scripts
# never run) and appends "<package> <version> <arch>" per package to TMP/packages.txt.
debs_unpack() {
  local tmp=$1 d
  shift
  apt_private "$tmp/apt" amd64
  mkdir -p "$tmp/x"
  say "downloading $*"
  (cd "$tmp/apt/cache/archives" && apt-get "${APT_OPTS[@]}" -qq download "$@" >&2)
  for d in "$tmp/apt/cache/archives/"*.deb; do
    dpkg-deb --show --showformat '${Package} ${Version} ${Architecture}\n' "$d" >>"$tmp/packages.txt"
    dpkg-deb -x "$d" "$tmp/x"
  done
}

# opensandbox_execd SRC COMMIT OUT: OpenSandbox's execd from the pinned copy SRC (the folder
# holding components/), built into OUT/execd with its bootstrap.sh beside it (OUT/bootstrap.sh),
# the commit stamped as the upstream Dockerfile does. The one recipe both OpenSandbox peers use
# (opensandbox.sh: the Docker runtime's execd_image; opensandbox-k8s.sh: the provider's
# execd-installer). components/execd and components/internal (its `replace ../internal`) are
# copied into OUT/src, never written in SRC, and removed afterwards; modules come from the Go
# module proxy as execd's go.sum pins them; the machine's build cache is used, so the standard
# library and common modules are compiled once for every Go peer.
opensandbox_execd() {
  local src=$1 commit=$2 out=$3 s v=github.com/alibaba/opensandbox/internal/version
  mkdir -p "$out/src"
  cp -R "$src/components/execd" "$src/components/internal" "$out/src/"
  chmod -R u+w "$out/src"
  s=$(date +%s)
  say "compiling execd at $commit"
  (cd "$out/src/execd" && GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 GOOS= GOARCH= \
    go build -trimpath -ldflags "-s -w -X $v.Version=$commit -X $v.GitCommit=$commit -X $v.BuildTime=unknown" \
      -o "$out/execd" .)
  say "execd built in $(($(date +%s) - s))s"
  install -m 755 "$src/components/execd/bootstrap.sh" "$out/bootstrap.sh"
  rm -rf "$out/src"
  grep -qE "^[[:space:]]path[[:space:]]+github.com/alibaba/opensandbox/execd([[:space:]]|$)" <<<"$(go version -m "$out/execd")" ||
    die "built execd is not github.com/alibaba/opensandbox/execd"
}
