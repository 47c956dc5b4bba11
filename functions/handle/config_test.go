package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/pull"
)

var update = flag.Bool("update", false, "rewrite handle's table in docs/CONFIGURATION.md (make docs)")

// TestConfigurationDoc keeps handle's table in docs/CONFIGURATION.md what
// envdoc renders from Config; with -update it rewrites that table.
func TestConfigurationDoc(t *testing.T) {
	if err := envdoc.Sync("../../docs/CONFIGURATION.md", "handle", &Config{}, *update); err != nil {
		t.Fatal(err)
	}
}

// TestBareNamesIgnored: handle reads each setting from its GDR_ name only; a
// bare MODE, BACKEND or CAPACITY in its environment changes nothing.
func TestBareNamesIgnored(t *testing.T) {
	functiontest.BareNamesIgnored(t, func() any { return &Config{} })
}

// A valid key, base64 of 32 bytes; tests check it never shows in an error.
const goodKey = "c2VjcmV0LWtleS1tYXRlcmlhbC0wMTIzNDU2Nzg5YWI="

func TestLoadConfig(t *testing.T) {
	pools := filepath.Join(t.TempDir(), "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{
		"GDR_POOLS_FILE": pools, "GDR_STATE_DIR": t.TempDir(),
		"GDR_BACKEND": "pod", "GDR_TRUST_DOMAIN": "ci.example.org", "GDR_ASSIGNMENT_VERIFY_KEYS": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=",
		"GDR_BOOTSTRAP_KEY": goodKey, "GDR_GATEWAY_URL": "https://gateway.example.org", "GDR_CLUSTER_NAME": "ci", "GDR_SPIRE_SERVER": "spire-server:8081",
	}
	for _, tc := range []struct {
		name    string
		set     map[string]string
		wantErr string
	}{
		{"valid", nil, ""},
		{"valid http", map[string]string{"GDR_MODE": "http"}, ""},
		{"unknown mode", map[string]string{"GDR_MODE": "daemon"}, `GDR_MODE "daemon"`},
		{"unknown backend", map[string]string{"GDR_BACKEND": "vm"}, `GDR_BACKEND: unknown backend "vm"`},
		{"bad trust domain", map[string]string{"GDR_TRUST_DOMAIN": "spiffe://x/y"}, "trust domain"},
		{"bad prefix", map[string]string{"GDR_METADATA_PREFIX": "Not_A_Domain"}, "metadata key prefix"},
		{"short key", map[string]string{"GDR_BOOTSTRAP_KEY": "c2hvcnQ="}, "5 bytes, need at least 32"},
		{"key not base64", map[string]string{"GDR_BOOTSTRAP_KEY": "not base64!"}, "not valid base64"},
		{"old keys", map[string]string{"GDR_BOOTSTRAP_OLD_KEYS": goodKey + "," + goodKey}, ""},
		{"a short old key", map[string]string{"GDR_BOOTSTRAP_OLD_KEYS": goodKey + ",c2hvcnQ="}, "GDR_BOOTSTRAP_OLD_KEYS: key 2 has 5 bytes, need at least 32"},
		{"an old key not base64", map[string]string{"GDR_BOOTSTRAP_OLD_KEYS": "not base64!"}, "GDR_BOOTSTRAP_OLD_KEYS: not a valid secretkey.Keys: key 1 is not valid base64"},
		{"zero capacity", map[string]string{"GDR_MAX_IN_FLIGHT": "0"}, "GDR_MAX_IN_FLIGHT 0"},
		{"zero batch", map[string]string{"GDR_BATCH": "0"}, "GDR_BATCH 0"},
		{"bad duration", map[string]string{"GDR_FETCH_WAIT": "soon"}, "FETCH_WAIT"},
		{"zero fetch wait", map[string]string{"GDR_FETCH_WAIT": "0s"}, "GDR_FETCH_WAIT 0s: want a positive duration"},
		{"zero nak delay", map[string]string{"GDR_NAK_DELAY": "0s"}, "GDR_NAK_DELAY 0s: want a positive duration"},
		{"zero error delay", map[string]string{"GDR_ERROR_DELAY": "0s"}, "GDR_ERROR_DELAY 0s: want a positive duration"},
		{"negative error delay", map[string]string{"GDR_ERROR_DELAY": "-1s"}, "GDR_ERROR_DELAY -1s: want a positive duration"},
		{"zero hold", map[string]string{"GDR_HOLD_FOR": "0s"}, "GDR_HOLD_FOR 0s: want a positive duration"},
		{"negative hold", map[string]string{"GDR_HOLD_FOR": "-2m"}, "GDR_HOLD_FOR -2m0s: want a positive duration"},
		{"lingering", map[string]string{"GDR_LINGER": "30s"}, ""},
		{"negative linger", map[string]string{"GDR_LINGER": "-1s"}, "GDR_LINGER -1s: want 0 (no lingering) or a positive duration"},
		{"zero linger bound", map[string]string{"GDR_LINGER_MAX": "0s"}, "GDR_LINGER_MAX 0s: want a positive duration"},
		{"bad gateway URL", map[string]string{"GDR_GATEWAY_URL": "gateway:443"}, "gateway URL"},
		{"plain http gateway", map[string]string{"GDR_GATEWAY_URL": "http://gateway.example.org"}, "not an absolute https URL"},
		{"gateway ID of another trust domain", map[string]string{"GDR_GATEWAY_SPIFFE_ID": "spiffe://evil.example.org/gateway"}, "GDR_GATEWAY_SPIFFE_ID"},
		{"no verification keys", map[string]string{"GDR_ASSIGNMENT_VERIFY_KEYS": ""}, "GDR_ASSIGNMENT_VERIFY_KEYS"},
		{"bad verification key", map[string]string{"GDR_ASSIGNMENT_VERIFY_KEYS": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=,c2hvcnQ="}, "GDR_ASSIGNMENT_VERIFY_KEYS: assignment verification key 2"},
		{"setup needs no verification keys", map[string]string{"GDR_MODE": "setup", "GDR_ASSIGNMENT_VERIFY_KEYS": ""}, ""},
		{"setup needs no gateway", map[string]string{"GDR_MODE": "setup", "GDR_GATEWAY_URL": "x"}, ""},
		{"pod backend without its cluster name", map[string]string{"GDR_CLUSTER_NAME": ""}, "GDR_CLUSTER_NAME is required for the pod backend"},
		{"pod backend without its SPIRE Server", map[string]string{"GDR_SPIRE_SERVER": ""}, "GDR_SPIRE_SERVER is required for the pod backend"},
		{"opensandbox backend without its URL", map[string]string{"GDR_BACKEND": "opensandbox"}, "GDR_OPENSANDBOX_URL is required"},
		{"process backend without a CA", map[string]string{"GDR_BACKEND": "process"}, "GDR_CA_DIR"},
		{"setup builds no backend", map[string]string{"GDR_MODE": "setup", "GDR_CLUSTER_NAME": ""}, ""},
		{"bad pools file", map[string]string{"GDR_POOLS_FILE": "/nonexistent/pools.yaml"}, "runner pools"},
		{"push URL", map[string]string{"GDR_METRICS_PUSH_URL": "http://pushgateway.monitoring.svc:9091"}, ""},
		{"push URL with credentials", map[string]string{"GDR_METRICS_PUSH_URL": "http://ci:secret-key-material@pushgateway:9091"}, "GDR_METRICS_PUSH_URL: no credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range base {
				t.Setenv(k, v)
			}
			for k, v := range tc.set {
				t.Setenv(k, v)
			}
			cfg, err := loadConfig()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				// The documented defaults are the core's and its adapter's own.
				if len(cfg.Key) != 32 || cfg.FetchWait != pull.DefaultWait || cfg.NakDelay != handler.DefaultNotYetDelay || cfg.ErrorDelay != handler.DefaultErrorDelay || cfg.HoldFor != pull.DefaultHoldFor {
					t.Fatalf("config = %+v", cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("loadConfig() error = %v, want it to mention %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), goodKey) || strings.Contains(err.Error(), "secret-key-material") {
				t.Fatalf("the error shows the key: %v", err)
			}
		})
	}
}

// loadConfig loads the configuration as main does, from the environment.
func loadConfig() (Config, error) {
	var c Config
	_, err := program.Load(&c, nil, io.Discard)
	return c, err
}
