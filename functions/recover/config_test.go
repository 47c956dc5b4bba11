package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/process"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
)

var update = flag.Bool("update", false, "rewrite recover's table in docs/CONFIGURATION.md (make docs)")

// TestConfigurationDoc keeps recover's table in docs/CONFIGURATION.md what
// envdoc renders from Config; with -update it rewrites that table.
func TestConfigurationDoc(t *testing.T) {
	if err := envdoc.Sync("../../docs/CONFIGURATION.md", "recover", &Config{}, *update); err != nil {
		t.Fatal(err)
	}
}

// TestBareNamesIgnored: recover reads each setting from its GDR_ name only; a
// bare MODE, BACKEND or CAPACITY in its environment changes nothing.
func TestBareNamesIgnored(t *testing.T) {
	functiontest.BareNamesIgnored(t, func() any { return &Config{} })
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: process, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key := "cGF5bG9hZC1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE="
	base := baseEnv(dir, pools, key)
	base["GDR_CA_DIR"] = filepath.Join(dir, "ca")
	for _, tc := range []struct {
		name    string
		set     map[string]string
		wantErr string
	}{
		{"valid", nil, ""},
		{"bad mode", map[string]string{"GDR_RECOVER_MODE": "daemon"}, "GDR_RECOVER_MODE"},
		{"http without a tick token", map[string]string{"GDR_RECOVER_MODE": "http"}, "GDR_TICK_TOKEN is required"},
		{"http with a tick token", map[string]string{"GDR_RECOVER_MODE": "http", "GDR_TICK_TOKEN": "t"}, ""},
		{"finish mode", map[string]string{"GDR_RECOVER_MODE": "finish"}, ""},
		{"finish mode without a batch", map[string]string{"GDR_RECOVER_MODE": "finish", "GDR_RECOVER_BATCH": "0"}, "GDR_RECOVER_BATCH"},
		{"finish mode without a retry delay", map[string]string{"GDR_RECOVER_MODE": "finish", "GDR_RECOVER_RETRY": "0s"}, "GDR_RECOVER_RETRY"},
		{"short signing key", map[string]string{"GDR_ASSIGNMENT_SIGNING_KEY": "c2hvcnQ="}, "GDR_ASSIGNMENT_SIGNING_KEY"},
		{"short payload key", map[string]string{"GDR_PAYLOAD_KEY": "c2hvcnQ="}, "GDR_PAYLOAD_KEY"},
		{"old keys", map[string]string{"GDR_PAYLOAD_OLD_KEYS": key + ",", "GDR_BOOTSTRAP_OLD_KEYS": key}, ""},
		{"a short old payload key", map[string]string{"GDR_PAYLOAD_OLD_KEYS": key + ",c2hvcnQ="}, "GDR_PAYLOAD_OLD_KEYS: key 2 has 5 bytes"},
		{"a short old bootstrap key", map[string]string{"GDR_BOOTSTRAP_OLD_KEYS": "c2hvcnQ="}, "GDR_BOOTSTRAP_OLD_KEYS: key 1 has 5 bytes"},
		{"process pool without a CA", map[string]string{"GDR_CA_DIR": ""}, "GDR_CA_DIR: the process backend needs a CA"},
		{"no pools file", map[string]string{"GDR_POOLS_FILE": filepath.Join(dir, "none")}, "runner pools"},
		{"push URL", map[string]string{"GDR_METRICS_PUSH_URL": "http://pushgateway.monitoring.svc:9091"}, ""},
		{"push URL with a query", map[string]string{"GDR_METRICS_PUSH_URL": "http://pushgateway:9091/?k=" + key}, "GDR_METRICS_PUSH_URL: no query"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range base {
				t.Setenv(k, v)
			}
			for k, v := range tc.set {
				t.Setenv(k, v)
			}
			_, err := loadConfig()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), key) {
				t.Fatalf("loadConfig() error = %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}
}

// A pool whose backend the build does not link (build tags, package
// backend/linked) is a configuration error naming the pools file and the pool.
func TestPoolBackendNotLinkedIsAConfigurationError(t *testing.T) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := baseEnv(dir, pools, "cGF5bG9hZC1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=")
	env["GDR_CLUSTER_NAME"], env["GDR_SPIRE_SERVER"] = "ci", "spire-server:8081"
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	want := "GDR_POOLS_FILE: pool linux: backend pod: this binary was built without that backend; it has [process]"
	if err := cfg.check(backend.Registry{process.Registration()}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("check = %v, want %q", err, want)
	}
}

// baseEnv is recover's environment with the pools file pools, the state
// directory dir and key as the payload and bootstrap keys, without any
// backend's settings.
func baseEnv(dir, pools, key string) map[string]string {
	return map[string]string{
		"GDR_GITEA_URL": "http://127.0.0.1:3000/", "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir,
		"GDR_TRUST_DOMAIN": "ci.example.org", "GDR_PAYLOAD_KEY": key, "GDR_BOOTSTRAP_KEY": key,
		"GDR_GATEWAY_URL": "https://gw.example.org", "GDR_ASSIGNMENT_SIGNING_KEY": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=",
	}
}

// loadConfig loads the configuration as main does, from the environment.
func loadConfig() (Config, error) {
	var c Config
	_, err := program.Load(&c, nil, io.Discard)
	return c, err
}
