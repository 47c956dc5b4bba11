# gitea-dynamic-runner
SHELL := /usr/bin/env bash
GO ?= go
BIN ?= bin
FUNCTIONS := $(notdir $(wildcard functions/*))
# An execution count, not a duration: Go 1.26's fuzz coordinator can fail a target with a bare
# "context deadline exceeded" when a duration ends mid-exec (go.dev/issue/75804, fixed in 1.27).
FUZZTIME ?= 50000x
BENCHTIME ?= 1s
MODULE := github.com/gitea-dynamic-runner/gitea-dynamic-runner
# COMMIT is what every binary's --version names (shared/function's stamp, set by the linker): the
# toolchain's own record of the commit is missing with -buildvcs=false in GOFLAGS, and outside a
# checkout; "+modified" when the checkout has changes.
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell test -n "$$(git status --porcelain 2>/dev/null)" && echo +modified)
LDFLAGS := $(if $(COMMIT),-X $(MODULE)/shared/function.stamp=$(COMMIT))

.PHONY: build test unit fuzz vet bench clean peers e2e e2e-cluster run try-gitea chaos chaos-gitea docs seccomp generate

## build: compile every function into $(BIN)/
build:
	@mkdir -p $(BIN)
	@for f in $(FUNCTIONS); do echo "go build ./functions/$$f"; $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/$$f ./functions/$$f || exit 1; done

## test: the race-enabled unit tests with every check of go vet, and every fuzz target for FUZZTIME
test: unit fuzz

# BACKEND_TAGS: one build tag per backend, gdr_<kind>, from the generated shared/backend/linked
BACKEND_TAGS := $(patsubst shared/backend/linked/%_off.go,gdr_%,$(wildcard shared/backend/linked/*_off.go))

# backend-vet: go vet on the builds of handle and recover for one backend (shared/backend/linked),
# with the build flags $(1)
backend-vet = for t in $(BACKEND_TAGS); do $(GO) vet $(1) -tags $$t ./shared/backend/linked/ ./functions/handle/ ./functions/recover/ || exit 1; done

## vet: go vet alone (unit runs the same checks on the race build)
vet:
	$(GO) vet ./...
	$(call backend-vet)

# unit compiles the module graph once, for vet and tests alike: -vet=all is go vet's every check
# (go test's default is a subset), and go test vets every package, those without test files
# too; -race on the backend builds' vet too, so it reuses the race build's packages (build tags
# are no part of a compiled package's cache key, only the files they select).
unit:
	$(call backend-vet,-race)
	$(GO) test -race -vet=all -count=1 ./...
	@# act's host mode has a data race of its own: the tests that drive act
	@# (build tag !race) run here, without the race detector, and their files are vetted here.
	$(GO) test -vet=all -count=1 ./shared/runner/reporter ./shared/runner/taskrun
	@# The build sidecar's seccomp profile: a module of its own (containerd/v2's
	@# requirements are not the product's), its test checks deploy/seccomp.
	cd internal/buildseccomp && $(GO) test -vet=all -count=1 ./...

# seccomp rewrites deploy/seccomp/buildkit-<GOARCH>.json from containerd's
# default profile (internal/buildseccomp); on an arm64 machine it writes arm64's.
seccomp:
	cd internal/buildseccomp && $(GO) test -count=1 -run TestShippedProfileIsGenerated . -update

fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

## run: the local quick start: GDR_REGISTRATION_TOKEN=<token> make run GITEA_URL=http://127.0.0.1:3000/
##      (the token comes from the environment, never a command line: ps shows every argument)
run:
	$(GO) run -ldflags "$(LDFLAGS)" ./functions/local --gitea-url "$(GITEA_URL)" $(if $(LABELS),--labels "$(LABELS)")

## try-gitea: a throwaway Gitea on 127.0.0.1:3000 to try local mode against
try-gitea:
	./scripts/try-gitea.sh up

## peers: build the real peers the end-to-end tests start (once; cached outside the checkout):
##        Gitea v1.27.3; Kubernetes v1.37.2 (kube-apiserver, kube-scheduler,
##        kube-controller-manager, kubelet, kube-proxy) + etcd v3.7.0; kubectl v1.37.2 (the
##        commands of deploy/README.md's install, run by TestE2EClusterReadme); helm v4.3.2 (the
##        commands of its Helm section, run by TestE2EClusterHelmBuiltinIdentity); spire-server and spire-agent
##        v1.13.3; the node's runtime from Debian's packages (containerd, runc, CNI plugins, nft);
##        kube-router v2.1.0's firewall with Debian's iptables and ipset (the test cluster's
##        NetworkPolicy dataplane; a test peer only); KEDA's operator v2.21.0; OpenSandbox's
##        lifecycle server (4db3a993, Debian trixie's python3) with Debian's docker.io 20.10 and
##        execd (a test peer only); OpenSandbox's Kubernetes runtime at the same commit: the
##        BatchSandbox controller manager, its CRDs and execd (a test peer only; about 830 s cold)
peers:
	./scripts/peers/gitea.sh build
	./scripts/peers/kube.sh build
	./scripts/peers/kubectl.sh build
	./scripts/peers/helm.sh build
	./scripts/peers/kube-node.sh build
	./scripts/peers/kube-router.sh build
	./scripts/peers/spire.sh build
	./scripts/peers/keda.sh build
	./scripts/peers/opensandbox.sh build
	./scripts/peers/opensandbox-k8s.sh build

## e2e: the end-to-end tests against real peers (build tag e2e), and the images' test; OpenSandbox's
##      Kubernetes runtime among them (internal/testenv/batchsandboxenv, shared/backend/opensandbox
##      and its sandboxapitest: TestE2EOpenSandboxKubernetes*, TestE2EOpenSandboxContractKubernetes).
##      The timeout is per package: deploy's cluster tests run two at a time beside one cluster
##      of another package (clusterenv's slots, GDR_TEST_CLUSTERS, docs/CLUSTER.md), each
##      waiting for a slot before its own timeout starts; 75 leaves room on a loaded machine
##      within CI's 90.
# E2E_PACKAGES: the packages with an end-to-end test (a TestE2E function): the others would each
# link a test binary that runs nothing.
E2E_PACKAGES = $(shell grep -rl --include='*_test.go' '^func TestE2E' . | xargs -r -n1 dirname | sort -u)
e2e: peers images
	$(GO) vet -tags e2e ./...
	CI=$${CI:-} $(GO) test -tags e2e -count=1 -timeout 75m -run 'E2E' $(E2E_PACKAGES)

## e2e-cluster: the test cluster's own tests alone (internal/testenv/clusterenv: one node, then
##        two; part of e2e too; needs root)
e2e-cluster:
	./scripts/peers/kube.sh build
	./scripts/peers/kube-node.sh build
	CI=$${CI:-} $(GO) test -tags e2e -count=1 -timeout 20m -v -run '^TestE2ECluster' ./internal/testenv/clusterenv/

## chaos: the chaos run of issue 13 at full size (internal/chaos): 1,000 tasks, at least 200
##        SIGKILLs of dispatch, handle, recover and gateway, 6 leader kills on a 3-node NATS cluster; `make test` runs a short one
CHAOS_TASKS ?= 1000
CHAOS_KILLS ?= 200
CHAOS_NATS_KILLS ?= 6
chaos:
	CHAOS_TASKS=$(CHAOS_TASKS) CHAOS_KILLS=$(CHAOS_KILLS) CHAOS_NATS_KILLS=$(CHAOS_NATS_KILLS) \
		CHAOS_DRAIN=$${CHAOS_DRAIN:-5m} $(GO) test -count=1 -v -timeout 60m -run '^TestChaos$$' ./internal/chaos/

## chaos-gitea: the chaos run against the real Gitea v1.27.3 (issue 31; TestChaosGitea, build tag
##        chaosgitea): CHAOS_GITEA_JOBS jobs of a real workflow run by the real local mode binary
##        (embedded NATS, process backend, gateway, runner), CHAOS_GITEA_KILLS SIGKILLs of local mode
##        mid-job and CHAOS_GITEA_RESTARTS SIGKILLs + restarts of Gitea; CHAOS_GITEA_SEED replays a run
CHAOS_GITEA_JOBS ?= 100
CHAOS_GITEA_KILLS ?= 30
CHAOS_GITEA_RESTARTS ?= 2
.PHONY: chaos-gitea
chaos-gitea:
	./scripts/peers/gitea.sh build
	$(GO) vet -tags chaosgitea ./internal/chaos/
	CHAOS_GITEA_JOBS=$(CHAOS_GITEA_JOBS) CHAOS_GITEA_KILLS=$(CHAOS_GITEA_KILLS) CHAOS_GITEA_RESTARTS=$(CHAOS_GITEA_RESTARTS) \
		CI=$${CI:-} $(GO) test -tags chaosgitea -count=1 -v -timeout 60m -run '^TestChaosGitea$$' ./internal/chaos/

## images: the container images, one OCI layout each in $(BIN)/images/<name>/ (docs/OPERATIONS.md):
##         dispatch, handle, recover, gateway, runner, runner-host, buildkit (a pool's rootless
##         image builder: scripts/peers/buildkit.sh), docker (rootless Docker: Debian trixie's,
##         scripts/peers/docker.sh, which also gives runner-host the Docker CLI, buildx and
##         compose); for PLATFORMS (default: this machine's alone, all the tests run; `make
##         release` sets both, linux/amd64,linux/arm64), the Debian packages and peers fetched
##         and built for those architectures only (scripts/peers/lib.sh image_arches);
##         reproducible (every timestamp SOURCE_DATE_EPOCH, default: the last commit's time)
RELEASE_PLATFORMS := linux/amd64,linux/arm64
PLATFORMS ?= linux/$(shell $(GO) env GOARCH)
comma := ,
empty :=
space := $(empty) $(empty)
# IMAGE_ARCHES: PLATFORMS' architectures, comma-separated (GDR_ARCHES of the image peers' scripts)
IMAGE_ARCHES = $(subst $(space),$(comma),$(strip $(foreach p,$(subst $(comma), ,$(PLATFORMS)),$(word 2,$(subst /, ,$(p))))))
.PHONY: images
images:
	@export GDR_ARCHES=$(IMAGE_ARCHES) && \
	debs=$$(./scripts/debs.sh build) && buildkit=$$(./scripts/peers/buildkit.sh build) && docker=$$(./scripts/peers/docker.sh build) && \
	SOURCE_DATE_EPOCH=$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct 2>/dev/null || echo 0)} \
	$(GO) run ./internal/imagebuild/cmd/images -out $(BIN)/images -platforms "$(PLATFORMS)" -packages "$$debs" -peer buildkit="$$buildkit" -peer docker="$$docker" -commit "$(COMMIT)"

## release: a release to install without building (internal/release): make images' layouts for
##          both platforms (PLATFORMS=$(RELEASE_PLATFORMS); a layout of fewer is refused; PLATFORMS
##          on the command line makes a release of those alone, as the tests' of this machine), each
##          index stamped with VERSION (vX.Y.Z), the chart (version and appVersion VERSION) naming
##          them under REGISTRY by digest, and SHA256SUMS, into RELEASE_DIR (deploy/REFERENCE.md,
##          "The Helm chart and releases"); `make release push VERSION=v0.2.0 REGISTRY=registry.example.net/gdr`
VERSION ?=
REGISTRY ?= ghcr.io/gitea-dynamic-runner
RELEASE_DIR ?= $(BIN)/release/$(VERSION)
PLAIN_HTTP ?= false
.PHONY: release push
release: PLATFORMS = $(RELEASE_PLATFORMS)
release: images
	@test -n "$(VERSION)" || { echo "make release: set VERSION=vX.Y.Z" >&2; exit 1; }
	SOURCE_DATE_EPOCH=$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct 2>/dev/null || echo 0)} \
	$(GO) run ./internal/release/cmd/release make -version $(VERSION) -registry $(REGISTRY) -images $(BIN)/images -platforms "$(PLATFORMS)" -out $(RELEASE_DIR)

## push: push RELEASE_DIR's release to REGISTRY, the registry it was made for: the images, then
##       the chart (OCI, oci://REGISTRY/gitea-dynamic-runner); credentials from
##       ~/.docker/config.json (`crane auth login`); PLAIN_HTTP=true for a registry without TLS
push:
	@test -n "$(VERSION)" || { echo "make push: set VERSION=vX.Y.Z" >&2; exit 1; }
	$(GO) run ./internal/release/cmd/release push -dir $(RELEASE_DIR) -registry $(REGISTRY) -plain-http=$(PLAIN_HTTP)

## docs: regenerate docs/CONFIGURATION.md's tables from the code: each package's TestConfigurationDoc
##       with -update rewrites its own section (one package at a time: they write one file);
##       `make test` fails while a table is stale; and the chart schema's pool profile rules
CONFIG_DOC_PACKAGES := ./functions/dispatch ./functions/handle ./functions/recover ./functions/gateway ./shared/runner ./functions/local
docs: generate
	@for p in $(CONFIG_DOC_PACKAGES); do $(GO) test -count=1 -run '^TestConfigurationDoc$$' $$p -update || exit 1; done
	$(GO) test -count=1 -run '^TestHelmSchemaChecksProfiles$$' ./deploy -update-schema

## generate: regenerate shared/backend/linked, the backends a build links by tag, from the backend
##           packages below shared/backend (internal/backendgen; docs/ADDING-A-BACKEND.md), and
##           the gdr_ build constraints of other files; `make test` fails while it is stale
generate:
	$(GO) run ./internal/backendgen

## bench: every benchmark, with memory figures (see docs/BENCHMARKS.md)
bench:
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) ./...

clean:
	rm -rf $(BIN)
