#!/usr/bin/env bash
# scripts/peers/opensandbox.sh: a real OpenSandbox lifecycle server with its Docker runtime, for
# the end-to-end tests of the opensandbox backend (shared/backend/opensandbox, harness
# internal/testenv/opensandboxenv).
#
# A TEST PEER ONLY. Nothing here is part of the product, its images or its install.
#
#   opensandbox.sh build   build once into
#                          ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/opensandbox-4db3a993/
#                            root/      Debian trixie's python3 and the server's Python
#                                       dependencies, unpacked; the server's source in
#                                       root/opt/server (run with chroot)
#                            docker/    Debian bookworm's docker.io 20.10.24, containerd, runc,
#                                       tini, unpacked (docker/usr/sbin/dockerd, docker/usr/bin/...)
#                            execd      the sandbox daemon, built CGO_ENABLED=0 from the copy
#                            bootstrap.sh  the copy's entrypoint wrapper, for the execd image
#                            busybox    Debian bookworm's busybox-static, the images' base
#                          and print that folder (fast no-op when already built)
#   opensandbox.sh path    print the folder if built, else exit 1
#
# The source is the pinned copy beside the checkout, ../shared/peers/opensandbox (see its
# PEER.md), or GDR_OPENSANDBOX_SRC. No registry serves it; it is built, never copied into the
# repository.
#
# Debian's packages are downloaded with private apt states (the machine's apt is untouched,
# nothing is installed) and unpacked with dpkg-deb -x (maintainer scripts never run, so the steps
# they would do are done here: the usrmerge symlinks, /etc/hosts, /etc/passwd, the CA bundle).
# trixie's sources are derived from the machine's own Debian sources (same mirror, suite
# `trixie`, component main); the machine's Debian archive keyring holds trixie's keys. The root's
# package set is the dependency closure of the packages below (apt-cache depends --recurse,
# without recommends or suggests).
# The folder is complete exactly when its stamp exists (temporary sibling, renamed into place,
# stamp written last); concurrent builds are serialized by a lock file.
# Cold build time, measured on 2 shared cores: see docs/OPENSANDBOX.md. Warm: instant.
set -euo pipefail

OS_COMMIT=4db3a993
PEER=opensandbox-$OS_COMMIT
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SRC=${GDR_OPENSANDBOX_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/../shared/peers/opensandbox}

# The server's Python dependencies (its pyproject.toml), as trixie packages, and a shell.
ROOT_DEBS=(python3 python3-fastapi python3-starlette python3-pydantic python3-pydantic-core
  python3-pydantic-settings python3-uvicorn python3-httpx python3-docker python3-kubernetes
  python3-redis python3-websockets python3-yaml python3-anyio python3-socksio python3-dotenv
  python3-watchfiles python3-httptools python3-uvloop python3-requests python3-urllib3
  dash coreutils ca-certificates)
# The Docker engine dockerd needs at run time (bookworm), and the images' base.
DOCKER_DEBS=(docker.io containerd runc tini busybox-static)

built() {
  [ -f "$STAMP" ] && [ -x "$DEST/root/usr/bin/python3" ] && [ -f "$DEST/root/opt/server/opensandbox_server/cli.py" ] &&
    [ -x "$DEST/docker/usr/sbin/dockerd" ] && [ -x "$DEST/docker/usr/bin/containerd" ] &&
    [ -x "$DEST/execd" ] && [ -f "$DEST/bootstrap.sh" ] && [ -x "$DEST/busybox" ]
}

# server_root TMP: the dependency closure of ROOT_DEBS from trixie, unpacked into TMP/root, made
# runnable with chroot, with the server's source in TMP/root/opt/server.
server_root() {
  local tmp=$1 st=$1/trixie d pkgs r
  mkdir -p "$st" "$tmp/root"
  trixie_sources "$(debian_sources)" "$st/trixie.sources"
  GDR_DEBIAN_SOURCES=$st/trixie.sources apt_private "$st/apt" amd64
  mapfile -t pkgs < <(apt-cache "${APT_OPTS[@]}" depends --recurse --no-recommends --no-suggests \
    --no-conflicts --no-breaks --no-replaces --no-enhances "${ROOT_DEBS[@]}" | grep '^[a-z0-9]' | sort -u)
  [ "${#pkgs[@]}" -gt 20 ] || die "trixie: dependency closure of ${ROOT_DEBS[*]} has only ${#pkgs[@]} packages"
  say "trixie: downloading ${#pkgs[@]} packages"
  (cd "$st/apt/cache/archives" && apt-get "${APT_OPTS[@]}" -qq download "${pkgs[@]}" >&2)
  r=$tmp/root
  for d in "$st/apt/cache/archives/"*.deb; do
    dpkg-deb --show --showformat '${Package} ${Version}\n' "$d" >>"$st/packages.txt"
    dpkg-deb -x "$d" "$r"
  done
  # What the packages' maintainer scripts and base-files would have made.
  for d in bin sbin lib lib64; do
    if [ -d "$r/usr/$d" ] && [ ! -e "$r/$d" ]; then ln -s "usr/$d" "$r/$d"; fi
  done
  mkdir -p "$r/proc" "$r/dev" "$r/tmp" "$r/root" "$r/etc/ssl/certs" "$r/run"
  chmod 1777 "$r/tmp"
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$r/etc/hosts"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
  cat "$r/usr/share/ca-certificates/mozilla/"*.crt >"$r/etc/ssl/certs/ca-certificates.crt"
  [ -x "$r/usr/bin/python3" ] || die "trixie root has no usr/bin/python3"
  mkdir -p "$r/opt"
  cp -r "$SRC/server" "$r/opt/server"
  rm -rf "$st/apt"
}

# docker_engine TMP: bookworm's docker.io, containerd, runc, tini and busybox-static, unpacked
# into TMP/docker; busybox kept as TMP/busybox.
docker_engine() {
  local tmp=$1
  debs_unpack "$tmp/dk" "${DOCKER_DEBS[@]}"
  mv "$tmp/dk/x" "$tmp/docker"
  mv "$tmp/docker/bin/busybox" "$tmp/busybox" 2>/dev/null || mv "$tmp/docker/usr/bin/busybox" "$tmp/busybox"
  [ -x "$tmp/docker/usr/sbin/dockerd" ] || die "docker.io has no usr/sbin/dockerd"
  if ldd "$tmp/docker/usr/sbin/dockerd" | grep -q 'not found'; then
    die "dockerd needs libraries the machine lacks: $(ldd "$tmp/docker/usr/sbin/dockerd" | grep 'not found' | tr '\n' ' ')"
  fi
  rm -rf "$tmp/dk/apt"
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  command -v apt-get >/dev/null || die "apt-get not found: the server's root and Docker come from Debian's packages"
  [ -f "$SRC/server/opensandbox_server/cli.py" ] && [ -f "$SRC/components/execd/go.mod" ] ||
    die "no OpenSandbox source at $SRC (set GDR_OPENSANDBOX_SRC to the pinned copy)"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local s pyv

  s=$(date +%s)
  server_root "$tmp"
  say "server root made in $(($(date +%s) - s))s"
  s=$(date +%s)
  docker_engine "$tmp"
  say "docker downloaded in $(($(date +%s) - s))s"
  opensandbox_execd "$SRC" "$OS_COMMIT" "$tmp"

  pyv=$(chroot "$tmp/root" /usr/bin/python3 -c 'import sys, fastapi, pydantic, uvicorn, docker; print(sys.version.split()[0], fastapi.__version__, pydantic.VERSION, uvicorn.__version__, docker.__version__)') ||
    die "the server root's python3 cannot import the server's dependencies"
  "$tmp/docker/usr/sbin/dockerd" --version | grep -q '20\.10\.' || die "docker/usr/sbin/dockerd is not 20.10"
  read -r py fa pd uv dk <<<"$pyv"
  mv "$tmp/trixie/packages.txt" "$tmp/root-packages.txt"
  mv "$tmp/dk/packages.txt" "$tmp/docker-packages.txt"
  rm -rf "$tmp/trixie" "$tmp/dk"
  {
    echo "opensandbox=$OS_COMMIT"
    echo "python=$py"
    echo "fastapi=$fa"
    echo "pydantic=$pd"
    echo "uvicorn=$uv"
    echo "docker-py=$dk"
    echo "docker.io=$(awk '$1 == "docker.io" {print $2}' "$tmp/docker-packages.txt")"
    awk '$1 == "containerd" || $1 == "runc" || $1 == "tini" || $1 == "busybox-static" {print $1 "=" $2}' "$tmp/docker-packages.txt"
    echo "execd=$OS_COMMIT $(go env GOVERSION)"
    echo "trixie-packages=$(wc -l <"$tmp/root-packages.txt")"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

peer_main "$@"
