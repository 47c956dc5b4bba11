#!/usr/bin/env bash
# scripts/peers/kube-node.sh: the rest of a real single-node Kubernetes cluster, beside the
# control plane kube.sh builds (kube-apiserver + etcd): the scheduler, the controller-manager,
# the kubelet, and a container runtime (containerd, runc, the CNI plugins).
#
#   kube-node.sh build   build/download once into
#                        ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/kube-node-v1.37.2/
#                          bin/{kube-scheduler,kube-controller-manager,kubelet}   (Go module proxy)
#                          bin/{containerd,containerd-shim-runc-v2,ctr,runc}       (Debian .debs)
#                          cni/{bridge,host-local,loopback,portmap,...}            (Debian .debs)
#                        and print that folder (fast no-op when already built)
#   kube-node.sh path    print the folder if built, else exit 1
#
# Kubernetes: the same throwaway module as kube.sh (k8s.io/kubernetes with its staging repos
# replaced by their published v0.<minor>.<patch>), the three commands compiled in ONE `go build`
# invocation so that their shared packages compile once. CGO_ENABLED=0, -trimpath, a private
# build cache deleted afterwards.
# Runtime: containerd, runc and containernetworking-plugins are Debian's (bookworm: 1.6.20,
# 1.1.5, 1.1.1), downloaded with a private apt state (the machine's apt is untouched, nothing
# is installed) and extracted with dpkg-deb -x; only their binaries are kept (static Go
# binaries, but runc, which links libseccomp: the machine's libseccomp2 is used).
# The folder is complete exactly when its stamp exists (temporary sibling, renamed into place,
# stamp written last); concurrent builds are serialized by a lock file.
set -euo pipefail

K8S_VERSION=v1.37.2
ROOT=${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}
DEST=$ROOT/kube-node-$K8S_VERSION
STAMP=$DEST/.complete
DEBS=(containerd runc containernetworking-plugins)

say() { echo "kube-node.sh: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

built() {
  [ -f "$STAMP" ] || return 1
  local b
  for b in kube-scheduler kube-controller-manager kubelet containerd containerd-shim-runc-v2 ctr runc; do
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
  rm -rf "$tmp/x" "$state"
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  command -v apt-get >/dev/null || die "apt-get not found: the runtime comes from Debian's packages"
  mkdir -p "$ROOT"
  exec 9>"$ROOT/.kube-node-$K8S_VERSION.lock"
  flock 9
  if built; then echo "$DEST"; return 0; fi

  local t0 tmp kmod staging gover minor patch sv ldflags vpkg s
  t0=$(date +%s)
  rm -rf "$ROOT/.kube-node-$K8S_VERSION.tmp."*
  tmp=$(mktemp -d "$ROOT/.kube-node-$K8S_VERSION.tmp.XXXXXX")
  chmod 755 "$tmp"
  # shellcheck disable=SC2064 # expand now: remove exactly this temp dir on any exit
  trap "chmod -R u+w '$tmp' 2>/dev/null; rm -rf '$tmp'" EXIT

  s=$(date +%s)
  runtime "$tmp"
  say "runtime downloaded in $(($(date +%s) - s))s"

  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  patch=${K8S_VERSION##*.}
  sv=v0.$minor.$patch
  export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOCACHE=$tmp/gocache
  unset GOOS GOARCH || true
  mkdir "$tmp/mod"
  kmod=$(cd "$tmp/mod" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$kmod" ] || die "go mod download k8s.io/kubernetes@$K8S_VERSION failed"
  staging=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$kmod" | sort -u)
  gover=$(awk '$1 == "go" {print $2; exit}' "$kmod")
  {
    echo "module gdr.local/kubenodepeer"
    echo
    echo "go $gover"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in $staging; do printf '\t%s => %s %s\n' "$m" "$m" "$sv"; done
    echo ")"
  } >"$tmp/mod/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler"\n\t_ "k8s.io/kubernetes/cmd/kubelet"\n)\n' >"$tmp/mod/tools.go"
  ldflags="-s -w"
  for vpkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
  done
  s=$(date +%s)
  say "compiling kube-scheduler, kube-controller-manager, kubelet $K8S_VERSION (one go build)"
  (cd "$tmp/mod" && go build -trimpath -ldflags "$ldflags" -o "$tmp/bin/" \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubelet)
  local kseconds=$(($(date +%s) - s))
  say "kubernetes built in ${kseconds}s"
  chmod -R u+w "$tmp/gocache" && rm -rf "$tmp/gocache" "$tmp/mod"
  for b in kube-scheduler kube-controller-manager kubelet; do
    "$tmp/bin/$b" --version 2>/dev/null | grep -qx "Kubernetes $K8S_VERSION" || die "built $b does not report $K8S_VERSION"
  done
  {
    echo "kubernetes=$K8S_VERSION"
    cat "$tmp/packages.txt"
    echo "go=$(go env GOVERSION)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "kubernetes_seconds=$kseconds"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  rm -rf "$DEST"
  mv "$tmp" "$DEST"
  trap - EXIT
  say "built in $(($(date +%s) - t0))s, $(du -sh "$DEST" | cut -f1)"
  echo "$DEST"
}

case "${1:-}" in
  build) build ;;
  path)
    if built; then echo "$DEST"; else exit 1; fi ;;
  *) die "usage: $0 build|path" ;;
esac
