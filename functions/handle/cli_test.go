package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
)

// The command line follows every function's conventions
// (functiontest.Conventions), run in process; without configuration it
// exits 2 and says so.
func TestCommandLine(t *testing.T) {
	functiontest.Run(t, "handle", execute, append(functiontest.Conventions("handle", true),
		functiontest.Case{Name: "no configuration", Code: 2, Want: []string{"handle: configuration: required variables not set"}}))
}

// A backend setting that is missing is bad configuration (exit 2, named),
// found before any connection is tried: it used to surface only when the
// backend was built, as a failure to run (exit 1).
func TestMissingBackendSettingIsAConfigurationError(t *testing.T) {
	pools := filepath.Join(t.TempDir(), "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"GDR_POOLS_FILE": pools, "GDR_STATE_DIR": t.TempDir(), "GDR_BACKEND": "pod", "GDR_TRUST_DOMAIN": "ci.example.org",
		"GDR_ASSIGNMENT_VERIFY_KEYS": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=", "GDR_BOOTSTRAP_KEY": goodKey,
		"GDR_GATEWAY_URL": "https://gateway.example.org", "GDR_MODE": "http", "GDR_HTTP_ADDR": "127.0.0.1:0",
		// Unreachable: were the backend built, the run would fail, not stop here.
		"KUBECONFIG": filepath.Join(t.TempDir(), "none"),
	} {
		t.Setenv(k, v)
	}
	var stderr bytes.Buffer
	if code := execute(context.Background(), nil, &stderr); code != 2 || !strings.Contains(stderr.String(), "handle: configuration: GDR_CLUSTER_NAME is required for the pod backend") {
		t.Fatalf("handle without GDR_CLUSTER_NAME exited %d, want 2 naming it; stderr:\n%s", code, stderr.String())
	}
}

// `handle keys` (the chart's keys Job) needs the release's namespace, and with GDR_KEYS_CA a
// gateway ID of the trust domain: missing or wrong, exit 2 naming the variable, before any
// connection.
func TestKeysConfiguration(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "GDR_KEYS_NAMESPACE"},
		{map[string]string{"GDR_KEYS_NAMESPACE": "gdr", "GDR_KEYS_CA": "true", "GDR_TRUST_DOMAIN": "ci.example.org", "GDR_GATEWAY_SPIFFE_ID": "spiffe://other.org/gateway"},
			`GDR_GATEWAY_SPIFFE_ID "spiffe://other.org/gateway": want a SPIFFE ID of trust domain ci.example.org`},
	} {
		for _, k := range []string{"GDR_KEYS_NAMESPACE", "GDR_KEYS_CA", "GDR_TRUST_DOMAIN", "GDR_GATEWAY_SPIFFE_ID"} {
			t.Setenv(k, tc.env[k]) // restored after the test
			if tc.env[k] == "" {
				os.Unsetenv(k)
			}
		}
		var stderr bytes.Buffer
		if code := execute(context.Background(), []string{"keys"}, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("handle keys with %v exited %d, want 2 naming %q; stderr:\n%s", tc.env, code, tc.want, stderr.String())
		}
	}
}
