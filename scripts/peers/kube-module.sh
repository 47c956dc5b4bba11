# scripts/peers/kube-module.sh: the throwaway module kube.sh and kubectl.sh both build from;
# sourced, never run.
#
# One module, one set of versions: kube.sh compiles the server commands and etcd in it, kubectl.sh
# kubectl, each with the machine's build cache (go env GOCACHE). Module requirements decide every
# shared package's version (minimal version selection over k8s.io/kubernetes and etcd's server
# together), so with the same go.mod the second build finds every package it shares with the
# first already compiled in the cache and compiles only its own: kubectl after kube.sh compiles
# what only kubectl imports, then links (docs/TESTING.md has the figures).
#
# k8s.io/kubernetes cannot be `go install`ed (it requires its staging repos at v0.0.0 and replaces
# them with ./staging paths that are not in the module zip), so the module replaces each staging
# repo with its published v0.<minor>.<patch>. The project's go.mod/go.sum are never touched.
#
# shellcheck shell=bash

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.0

# kube_module DIR PKG...: writes DIR/go.mod (k8s.io/kubernetes at K8S_VERSION and etcd's server
# module at ETCD_VERSION, the staging repos replaced) and DIR/tools.go importing PKG (the mains
# the caller builds; `go build` with GOFLAGS=-mod=mod completes go.sum), and sets KUBE_LDFLAGS,
# the version stamp Kubernetes' own build sets (else /version says v0.0.0-master).
kube_module() {
  local dir=$1 kmod staging gover minor patch sv m vpkg
  shift
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  patch=${K8S_VERSION##*.}
  sv=v0.$minor.$patch
  mkdir -p "$dir"
  say "fetching k8s.io/kubernetes@$K8S_VERSION go.mod"
  kmod=$(cd "$dir" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$kmod" ] || die "go mod download k8s.io/kubernetes@$K8S_VERSION failed"
  staging=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$kmod" | sort -u)
  [ -n "$staging" ] || die "no staging requirements in $kmod"
  gover=$(awk '$1 == "go" {print $2; exit}' "$kmod")
  {
    printf 'module gdr.local/kubepeer\n\ngo %s\n\nrequire (\n' "$gover"
    printf '\tgo.etcd.io/etcd/server/v3 %s\n\tk8s.io/kubernetes %s\n)\n\nreplace (\n' "$ETCD_VERSION" "$K8S_VERSION"
    for m in $staging; do printf '\t%s => %s %s\n' "$m" "$m" "$sv"; done
    printf ')\n'
  } >"$dir/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "go.etcd.io/etcd/server/v3"\n'
    for m in "$@"; do printf '\t_ "%s"\n' "$m"; done
    printf ')\n'
  } >"$dir/tools.go"
  KUBE_LDFLAGS="-s -w"
  for vpkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    KUBE_LDFLAGS="$KUBE_LDFLAGS -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
  done
}
