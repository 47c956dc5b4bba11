#!/usr/bin/env bash
# scripts/peers/kube-router.sh: the NetworkPolicy dataplane of the single-node test cluster
# (internal/testenv/clusterenv, Cluster.StartNetworkPolicy): kube-router's network policy
# controller, run with its firewall only (no routing, no service proxy), and the iptables and
# ipset commands it drives.
#
# A TEST PEER ONLY. kube-router v2.1.0 and the dependencies it pins have published security
# advisories; it runs here inside the test node's private namespaces, against a throwaway API
# server, and is never part of the product, its images or its install.
#
#   kube-router.sh build   build once into
#                          ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/kube-router-v2.1.0/
#                            kube-router                                 v2.1.0, from the Go module proxy
#                            bin/{iptables,iptables-save,iptables-restore,ip6tables,
#                                 ip6tables-save,ip6tables-restore,ipset} wrappers (below)
#                            libexec/, lib/, xtables/                    Debian bookworm's iptables
#                                                                        1.8.9 (legacy backend) and ipset 7.17
#                          and print that folder (fast no-op when already built)
#   kube-router.sh path    print the folder if built, else exit 1
#
# kube-router: a throwaway module outside the checkout requires
# github.com/cloudnativelabs/kube-router/v2 (whose go.mod has no replace or exclude directive) and
# builds its cmd/kube-router with CGO_ENABLED=0, -trimpath, its own version stamp
# (pkg/version.Version, as its Makefile sets it) and the machine's build cache (go env GOCACHE:
# its keys cover CGO_ENABLED, tags and flags, so no peer's build can poison another's; the
# standard library and the Kubernetes client modules it shares with kube.sh compile once).
#
# iptables and ipset: the machine has neither. Debian's packages are downloaded with a private apt
# state (the machine's apt is untouched, nothing is installed) and unpacked with dpkg-deb -x. Each
# bin/ command is a wrapper that points the loader at lib/ and iptables at its extensions in
# xtables/ (XTABLES_LIBDIR), then runs libexec/<name>, a link to xtables-legacy-multi (which picks
# its personality from its name) or the ipset binary. The legacy (xtables) backend, because this
# machine's kernel has xtables with every match kube-router uses (set, physdev, addrtype,
# conntrack, comment, mark, NFLOG, REJECT) and the node's nft tables stay kube-proxy's alone.
# The folder is complete exactly when its stamp exists (temporary sibling, renamed into place,
# stamp written last); concurrent builds are serialized by a lock file.
# Cold (kube-router's modules already in the module cache, then an empty private build cache, since
# dropped), measured on 2 shared cores: see docs/CLUSTER.md. Warm (folder present): instant.
set -euo pipefail

KR_VERSION=v2.1.0
KR_MODULE=github.com/cloudnativelabs/kube-router/v2
PEER=kube-router-$KR_VERSION
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DEBS=(iptables libip4tc2 libip6tc2 libxtables12 libmnl0 libnetfilter-conntrack3 libnfnetlink0 libnftnl11 ipset libipset13)
COMMANDS=(iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore ipset)

built() {
  [ -f "$STAMP" ] && [ -x "$DEST/kube-router" ] || return 1
  local b
  for b in "${COMMANDS[@]}"; do
    [ -x "$DEST/bin/$b" ] || return 1
  done
}

# tools TMP: Debian's iptables and ipset into TMP/{libexec,lib,xtables,bin}.
tools() {
  local tmp=$1 c
  mkdir -p "$tmp/bin" "$tmp/libexec" "$tmp/lib" "$tmp/xtables"
  debs_unpack "$tmp" "${DEBS[@]}"
  cp "$tmp/x/usr/sbin/xtables-legacy-multi" "$tmp/libexec/"
  cp "$tmp/x/usr/sbin/ipset" "$tmp/libexec/ipset"
  cp -P "$tmp/x/usr/lib/x86_64-linux-gnu/"lib*.so* "$tmp/lib/"
  cp "$tmp/x/usr/lib/x86_64-linux-gnu/xtables/"*.so "$tmp/xtables/"
  for c in "${COMMANDS[@]}"; do
    [ "$c" = ipset ] || ln -s xtables-legacy-multi "$tmp/libexec/$c"
    # The wrapper finds the folder from its own path, wherever the folder is.
    printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/..\nLD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" XTABLES_LIBDIR="$d/xtables" exec "$d/libexec/%s" "$@"\n' "$c" >"$tmp/bin/$c"
    chmod 755 "$tmp/bin/$c"
  done
  rm -rf "$tmp/x" "$tmp/apt"
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  command -v apt-get >/dev/null || die "apt-get not found: iptables and ipset come from Debian's packages"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local info kmod gover s

  s=$(date +%s)
  tools "$tmp"
  say "iptables and ipset downloaded in $(($(date +%s) - s))s"
  grep -q 'iptables v1\.8\.9 (legacy)' <<<"$("$tmp/bin/iptables" --version)" || die "bin/iptables is not iptables 1.8.9 (legacy)"
  grep -q 'ipset v7\.' <<<"$("$tmp/bin/ipset" --version)" || die "bin/ipset is not ipset 7"

  export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  unset GOOS GOARCH || true
  mkdir "$tmp/mod"
  say "fetching $KR_MODULE@$KR_VERSION"
  info=$(cd "$tmp/mod" && GOFLAGS= go mod download -json "$KR_MODULE@$KR_VERSION")
  kmod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' <<<"$info")
  [ -f "$kmod" ] || die "go mod download $KR_MODULE@$KR_VERSION failed"
  ! grep -qE '^(replace|exclude)([[:space:]]|$)' "$kmod" || die "$kmod has replace/exclude directives: copy them"
  gover=$(awk '$1 == "go" {print $2; exit}' "$kmod")
  printf 'module gdr.local/kuberouterpeer\n\ngo %s\n\nrequire %s %s\n' "$gover" "$KR_MODULE" "$KR_VERSION" >"$tmp/mod/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd/kube-router"\n' "$KR_MODULE" >"$tmp/mod/tools.go"
  (
    cd "$tmp/mod"
    s=$(date +%s)
    say "compiling kube-router $KR_VERSION"
    go build -trimpath -ldflags "-s -w -X $KR_MODULE/pkg/version.Version=$KR_VERSION -X $KR_MODULE/pkg/version.BuildDate=module-proxy" \
      -o "$tmp/kube-router" "$KR_MODULE/cmd/kube-router"
    say "kube-router built in $(($(date +%s) - s))s"
  )
  rm -rf "$tmp/mod"
  grep -qE "^[[:space:]](mod|dep)[[:space:]]+$KR_MODULE[[:space:]]+$KR_VERSION([[:space:]]|$)" <<<"$(go version -m "$tmp/kube-router")" ||
    die "built kube-router does not embed $KR_MODULE $KR_VERSION"
  grep -q "$KR_VERSION" <<<"$("$tmp/kube-router" --version 2>&1)" || die "kube-router --version does not say $KR_VERSION"
  {
    echo "kube-router=$KR_VERSION"
    echo "go=$(go env GOVERSION)"
    cat "$tmp/packages.txt"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  rm -f "$tmp/packages.txt"
  build_end
}

peer_main "$@"
