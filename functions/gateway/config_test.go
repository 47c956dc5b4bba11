package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
)

var update = flag.Bool("update", false, "rewrite gateway's table in docs/CONFIGURATION.md (make docs)")

// TestConfigurationDoc keeps gateway's table in docs/CONFIGURATION.md what
// envdoc renders from Config; with -update it rewrites that table.
func TestConfigurationDoc(t *testing.T) {
	if err := envdoc.Sync("../../docs/CONFIGURATION.md", "gateway", &Config{}, *update); err != nil {
		t.Fatal(err)
	}
}

// TestBareNamesIgnored: gateway reads each setting from its GDR_ name only; a
// bare MODE, BACKEND or CAPACITY in its environment changes nothing.
func TestBareNamesIgnored(t *testing.T) {
	functiontest.BareNamesIgnored(t, func() any { return &Config{} })
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key := "cGF5bG9hZC1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE="
	base := map[string]string{
		"GDR_GITEA_URL": "http://127.0.0.1:3000/", "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir,
		"GDR_TRUST_DOMAIN": "ci.example.org", "GDR_PAYLOAD_KEY": key, "GDR_BOOTSTRAP_KEY": key,
	}
	for _, tc := range []struct {
		name    string
		set     map[string]string
		wantErr string
	}{
		{"valid", nil, ""},
		{"short bootstrap key", map[string]string{"GDR_BOOTSTRAP_KEY": "c2hvcnQ="}, "GDR_BOOTSTRAP_KEY"},
		{"old keys", map[string]string{"GDR_PAYLOAD_OLD_KEYS": oldKey + ", " + key, "GDR_BOOTSTRAP_OLD_KEYS": oldKey + ","}, ""},
		{"an old payload key not base64", map[string]string{"GDR_PAYLOAD_OLD_KEYS": oldKey + ",s3cr3t!!"}, "GDR_PAYLOAD_OLD_KEYS: not a valid secretkey.Keys: key 2 is not valid base64"},
		{"a short old payload key", map[string]string{"GDR_PAYLOAD_OLD_KEYS": oldKey + ",c2hvcnQ="}, "GDR_PAYLOAD_OLD_KEYS: key 2 has 5 bytes, need exactly 32"},
		{"an old bootstrap key not base64", map[string]string{"GDR_BOOTSTRAP_OLD_KEYS": "s3cr3t!!"}, "GDR_BOOTSTRAP_OLD_KEYS: not a valid secretkey.Keys: key 1 is not valid base64"},
		{"a short old bootstrap key", map[string]string{"GDR_BOOTSTRAP_OLD_KEYS": "c2hvcnQ=," + oldKey}, "GDR_BOOTSTRAP_OLD_KEYS: key 1 has 5 bytes, need at least 32"},
		{"cert without key", map[string]string{"GDR_SVID_CERT": "/x.pem"}, "go together"},
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
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), key) || strings.Contains(err.Error(), oldKey) || strings.Contains(err.Error(), "s3cr3t") {
				t.Fatalf("loadConfig() error = %v, want it to mention %q", err, tc.wantErr)
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

// oldKey is a rotation's other key (32 bytes).
const oldKey = "b2xkLWtleS1tYXRlcmlhbC1vZi0zMi1ieXRlcy1hYmM="

// TestOldKeysReachTheGateway: the gateway reads GDR_BOOTSTRAP_OLD_KEYS into the verifier it
// checks executors' capabilities with, and GDR_PAYLOAD_OLD_KEYS into its payload keys: a
// capability issued under the old key is accepted once the key is listed, refused otherwise.
func TestOldKeysReachTheGateway(t *testing.T) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	current := "cGF5bG9hZC1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE="
	var old secretkey.Key
	if err := old.Decode(oldKey); err != nil {
		t.Fatal(err)
	}
	issuer, err := bootstrap.NewVerifier(old)
	if err != nil {
		t.Fatal(err)
	}
	const assignmentID, spiffeID = "linux-7", "spiffe://ci.example.org/repo/alice/repo/task/7"
	capability := issuer.Capability(assignmentID, 7, spiffeID)
	for _, tc := range []struct {
		name   string
		oldVar string
		ok     bool
	}{
		{"listed", oldKey, true},
		{"listed after another", current + "," + oldKey, true},
		{"not listed", "", false},
		{"another listed", current, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range map[string]string{
				"GDR_GITEA_URL": "http://127.0.0.1:3000/", "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir, "GDR_TRUST_DOMAIN": "ci.example.org",
				"GDR_PAYLOAD_KEY": current, "GDR_BOOTSTRAP_KEY": current, "GDR_BOOTSTRAP_OLD_KEYS": tc.oldVar, "GDR_PAYLOAD_OLD_KEYS": tc.oldVar,
			} {
				t.Setenv(k, v)
			}
			cfg, err := loadConfig()
			if err != nil {
				t.Fatal(err)
			}
			v, err := cfg.KeySettings.Verifier()
			if err != nil {
				t.Fatal(err)
			}
			if err := v.Verify(assignmentID, 7, spiffeID, capability); (err == nil) != tc.ok {
				t.Fatalf("a capability of the old key: Verify() = %v, want ok=%v", err, tc.ok)
			}
			if got := slices.ContainsFunc(cfg.PayloadOldKeys, func(k secretkey.Key) bool { return bytes.Equal(k, old) }); got != tc.ok {
				t.Fatalf("GDR_PAYLOAD_OLD_KEYS %q: the old key among the payload keys = %v, want %v", tc.oldVar, got, tc.ok)
			}
		})
	}
}
