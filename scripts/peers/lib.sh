# scripts/peers/lib.sh: what every peer script shares; sourced, never run.
#
# A peer is built once into a versioned folder, $DEST = $ROOT/$PEER, which is complete exactly
# when it exists: it is assembled in a temporary sibling and renamed into place with its stamp
# file ($STAMP) written last, so a killed build leaves no folder that looks built. Concurrent
# builds of one peer are serialized by a lock file beside it.
#
# The sourcing script sets PEER (the folder's name, with its version) first and defines built()
# (true when $DEST holds everything) after. Its build() runs:
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
