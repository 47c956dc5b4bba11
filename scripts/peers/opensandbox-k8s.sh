#!/usr/bin/env bash
# scripts/peers/opensandbox-k8s.sh: OpenSandbox's Kubernetes runtime as the lifecycle server's
# `[runtime] type = "kubernetes"` (provider `batchsandbox`) uses it: the controller manager (the
# BatchSandbox, Pool and SandboxSnapshot controllers) with its CRDs, and what every sandbox Pod
# runs besides the user's image: execd and bootstrap.sh (the execd-installer init container copies
# them into the Pod) and a shell. Our end-to-end tests run the manager out of cluster against the
# test cluster and build the node's images from these files (internal/testenv/batchsandboxenv).
#
#   opensandbox-k8s.sh build   build once into
#                              ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/opensandbox-k8s-4db3a993/:
#                                manager       the controller manager (kubernetes/cmd/controller)
#                                crds/         its CRDs (kubernetes/config/crd/bases)
#                                execd         the sandbox daemon (components/execd), static
#                                bootstrap.sh  the entrypoint wrapper (components/execd/bootstrap.sh)
#                                busybox       Debian bookworm's busybox-static (the images' shell)
#                              and print that folder (fast no-op when already built)
#   opensandbox-k8s.sh path    print the folder if built, else exit 1
#
# No registry serves OpenSandbox's code: it is built from the pinned copy of OpenSandbox at commit
# 4db3a993 beside the checkout (../shared/peers/opensandbox from the repository's root; another
# copy with GDR_OPENSANDBOX_SRC, the folder holding PEER.md, kubernetes/ and components/). The
# modules are copied into a temporary folder and built there (the pinned copy is never written),
# their dependencies fetched from the Go module proxy. The manager is built against our module's
# versions of the modules it shares with ours (Kubernetes v0.37's libraries, controller-runtime
# v0.25... where upstream pins v0.33 and v0.21; none lowered) and with our tests' build flags, so
# that most of its packages are compiled once for both (measured: docs/OPENSANDBOX-KUBERNETES.md);
# it runs on the test machine, out of cluster, so it links the machine's libc like our tests.
# execd as its go.sum pins it (its `replace ... => ../internal` kept by copying
# components/internal beside it), CGO_ENABLED=0, -trimpath (lib.sh's opensandbox_execd, the
# recipe opensandbox.sh uses too). Both: the commit stamped as the upstream Dockerfiles do, the
# machine's build cache. busybox-static comes from a private apt state (lib.sh debs_unpack: the
# machine's apt is untouched, nothing installed). Not built: the task executor and the image
# committer (pool mode and snapshots; a BatchSandbox made from a Pod template needs neither).
# Cold timings: docs/OPENSANDBOX-KUBERNETES.md.
set -euo pipefail

OPENSANDBOX_COMMIT=4db3a993
PEER=opensandbox-k8s-$OPENSANDBOX_COMMIT
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SRC=${GDR_OPENSANDBOX_SRC:-$REPO/../shared/peers/opensandbox}

# DEPS names how the manager's dependencies are chosen; a folder built otherwise is rebuilt.
DEPS=ours
built() {
  [ -f "$STAMP" ] && grep -qx "deps=$DEPS" "$STAMP" && [ -x "$DEST/manager" ] && [ -f "$DEST/crds/sandbox.opensandbox.io_batchsandboxes.yaml" ] &&
    [ -x "$DEST/execd" ] && [ -f "$DEST/bootstrap.sh" ] && [ -x "$DEST/busybox" ]
}

build() {
  if built; then echo "$DEST"; return 0; fi
  command -v go >/dev/null || die "go not found in PATH"
  command -v apt-get >/dev/null || die "apt-get not found (busybox-static comes from Debian)"
  [ -f "$SRC/kubernetes/go.mod" ] && [ -f "$SRC/components/execd/go.mod" ] ||
    die "no OpenSandbox copy at $SRC (set GDR_OPENSANDBOX_SRC)"
  grep -q "$OPENSANDBOX_COMMIT" "$SRC/PEER.md" || die "$SRC/PEER.md does not name commit $OPENSANDBOX_COMMIT"
  build_begin || { echo "$DEST"; return 0; } # another build finished while we waited
  local module
  module=$(awk '$1 == "module" {print $2; exit}' "$SRC/kubernetes/go.mod")
  [ -n "$module" ] || die "$SRC/kubernetes/go.mod names no module"

  # The machine's build cache: the standard library and modules shared with the other Go peers
  # are compiled once.
  mkdir -p "$tmp/src"
  cp -R "$SRC/kubernetes" "$tmp/src/kubernetes"
  chmod -R u+w "$tmp/src"
  (
    local s
    s=$(date +%s)
    # Our module's versions: a module of its own (ours/go.mod) requires every module of our
    # build list at our version, and the copy requires it, so the module graph's minimal version
    # selection raises each module the copy shares with ours to our version and lowers none;
    # tidy then drops that module again (the copy imports nothing of it). The manager then
    # compiles against the Kubernetes libraries, controller-runtime and the rest exactly as our
    # tests do, with their flags (no -trimpath, cgo as the machine has it): the compiled packages
    # are the same cache entries, and a machine that has built our tests compiles little more.
    mkdir "$tmp/src/ours"
    {
      printf 'module gdr.local/ours\n\ngo 1.24\n\nrequire (\n'
      (cd "$REPO" && GOWORK=off GOFLAGS=-mod=readonly go list -m -f '{{if not .Main}}{{"\t"}}{{.Path}} {{.Version}}{{"\n"}}{{end}}' all) | grep .
      printf ')\n'
    } >"$tmp/src/ours/go.mod"
    cd "$tmp/src/kubernetes"
    export GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" GOOS= GOARCH=
    go mod edit -require=gdr.local/ours@v0.0.0 -replace=gdr.local/ours=../ours
    go mod tidy
    say "compiling $module/cmd/controller at $OPENSANDBOX_COMMIT with our module's versions"
    GOFLAGS="-mod=readonly -buildvcs=false" \
      go build -ldflags "-s -w -X main.commitID=$OPENSANDBOX_COMMIT" -o "$tmp/manager" ./cmd/controller
    say "manager built in $(($(date +%s) - s))s"
  )
  opensandbox_execd "$SRC" "$OPENSANDBOX_COMMIT" "$tmp"
  mkdir "$tmp/crds"
  cp "$SRC"/kubernetes/config/crd/bases/*.yaml "$tmp/crds/"
  chmod 644 "$tmp"/crds/*.yaml
  rm -rf "$tmp/src"

  mkdir "$tmp/debs"
  debs_unpack "$tmp/debs" busybox-static
  install -m 755 "$tmp/debs/x/bin/busybox" "$tmp/busybox"
  cp "$tmp/debs/packages.txt" "$tmp/packages.txt"
  rm -rf "$tmp/debs"

  grep -qE "^[[:space:]]path[[:space:]]+$module/cmd/controller([[:space:]]|$)" <<<"$(go version -m "$tmp/manager")" ||
    die "built manager is not $module/cmd/controller"
  "$tmp/busybox" sh -c 'exit 0' || die "busybox does not run"
  {
    echo "opensandbox=$OPENSANDBOX_COMMIT"
    echo "deps=$DEPS"
    echo "go=$(go env GOVERSION)"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "seconds=$(($(date +%s) - t0))"
  } >"$tmp/.complete"
  build_end
}

peer_main "$@"
