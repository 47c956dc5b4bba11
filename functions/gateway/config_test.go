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
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), key) {
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
