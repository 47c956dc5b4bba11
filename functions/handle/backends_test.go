package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/linked"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/process"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// A build links every backend unless its tags name some; a handle for the
// process backend (-tags gdr_process) links neither client-go nor gRPC,
// whose package initialisation and code dominated its cold start.
func TestBuildTagsSelectBackends(t *testing.T) {
	for _, kind := range []taskassignment.BackendKind{taskassignment.BackendProcess, taskassignment.BackendOpenSandbox, taskassignment.BackendPod} {
		if err := linked.Backends().Linked(kind); err != nil {
			t.Errorf("the test build: %v", err) // go test builds with no gdr_ tag
		}
	}
	deps := func(tags string) []string {
		out, err := exec.Command("go", "list", "-tags", tags, "-deps", ".").Output()
		if err != nil {
			t.Fatalf("go list -tags %q: %v", tags, err)
		}
		return strings.Fields(string(out))
	}
	heavy := []string{"k8s.io/client-go/kubernetes", "google.golang.org/grpc", "github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod",
		"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"}
	all, process := deps(""), deps("gdr_process")
	for _, p := range heavy {
		if !slices.Contains(all, p) {
			t.Errorf("the default build does not link %s", p)
		}
		if slices.Contains(process, p) {
			t.Errorf("-tags gdr_process links %s", p)
		}
	}
	if !slices.Contains(process, "github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/process") {
		t.Error("-tags gdr_process does not link the process backend")
	}
	// Nor does any build of handle link what only dispatch and recover use:
	// act's workflow model (go-git, OpenPGP), the dispatcher, recoverer.
	for _, p := range []string{"github.com/nektos/act/pkg/model", "github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher",
		"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"} {
		if slices.Contains(all, p) {
			t.Errorf("handle links %s", p)
		}
	}
}

// GDR_BACKEND naming a backend the build does not link is a configuration
// error naming the variable, except in setup mode, which builds none.
func TestBackendNotLinkedIsAConfigurationError(t *testing.T) {
	processOnly := backend.Registry{process.Registration()}
	pools := filepath.Join(t.TempDir(), "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"GDR_POOLS_FILE": pools, "GDR_STATE_DIR": t.TempDir(), "GDR_BACKEND": "pod", "GDR_CLUSTER_NAME": "ci", "GDR_SPIRE_SERVER": "spire-server:8081",
		"GDR_TRUST_DOMAIN": "ci.example.org", "GDR_ASSIGNMENT_VERIFY_KEYS": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=",
		"GDR_BOOTSTRAP_KEY": goodKey, "GDR_GATEWAY_URL": "https://gateway.example.org",
	} {
		t.Setenv(k, v)
	}
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	want := `GDR_BACKEND "pod": this binary was built without that backend; it has process`
	if err := cfg.check(processOnly); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("check = %v, want %q", err, want)
	}
	cfg.Mode = modeSetup
	if err := cfg.check(processOnly); err != nil {
		t.Fatalf("setup mode: %v", err)
	}
}
