package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
)

var update = flag.Bool("update", false, "rewrite dispatch's table in docs/CONFIGURATION.md (make docs)")

// TestConfigurationDoc keeps dispatch's table in docs/CONFIGURATION.md what
// envdoc renders from Config; with -update it rewrites that table.
func TestConfigurationDoc(t *testing.T) {
	if err := envdoc.Sync("../../docs/CONFIGURATION.md", "dispatch", &Config{}, *update); err != nil {
		t.Fatal(err)
	}
}

// TestBareNamesIgnored: dispatch reads each setting from its GDR_ name only; a
// bare MODE, BACKEND or CAPACITY in its environment changes nothing.
func TestBareNamesIgnored(t *testing.T) {
	functiontest.BareNamesIgnored(t, func() any { return &Config{} })
}

const testKey = "cGF5bG9hZC1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=" // 32 bytes

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3, jobTimeout: 2h}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{
		"GDR_GITEA_URL": "http://127.0.0.1:3000/", "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir,
		"GDR_TRUST_DOMAIN": "ci.example.org", "GDR_PAYLOAD_KEY": testKey,
		"GDR_ASSIGNMENT_SIGNING_KEY": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=",
	}
	for _, tc := range []struct {
		name    string
		set     map[string]string
		wantErr string
	}{
		{"valid", nil, ""},
		{"missing pools file", map[string]string{"GDR_POOLS_FILE": filepath.Join(dir, "none.yaml")}, "runner pools"},
		{"a paused name that is no pool", map[string]string{"GDR_PAUSED_POOLS": "nope"}, `GDR_PAUSED_POOLS: pool "nope" is not in the pools file`},
		{"short payload key", map[string]string{"GDR_PAYLOAD_KEY": "c2hvcnQ="}, "GDR_PAYLOAD_KEY: key has 5 bytes"},
		{"old payload keys", map[string]string{"GDR_PAYLOAD_OLD_KEYS": testKey + ","}, ""},
		{"old webhook secrets", map[string]string{"GDR_WEBHOOK_SECRET": "s3cret", "GDR_WEBHOOK_OLD_SECRETS": "0ld-1,0ld-2"}, ""},
		{"old webhook secrets without the secret", map[string]string{"GDR_WEBHOOK_OLD_SECRETS": "0ld-1"}, "GDR_WEBHOOK_OLD_SECRETS is set but GDR_WEBHOOK_SECRET is empty"},
		{"a short old payload key", map[string]string{"GDR_PAYLOAD_OLD_KEYS": testKey + ",c2hvcnQ="}, "GDR_PAYLOAD_OLD_KEYS: key 2 has 5 bytes, need exactly 32"},
		{"zero keep-alive", map[string]string{"GDR_KEEPALIVE": "0s"}, "GDR_KEEPALIVE"},
		{"bad trust domain", map[string]string{"GDR_TRUST_DOMAIN": "Not A Domain"}, "trust domain"},
		{"short signing key", map[string]string{"GDR_ASSIGNMENT_SIGNING_KEY": "c2hvcnQ="}, "GDR_ASSIGNMENT_SIGNING_KEY: assignment signing key: 5 bytes"},
		{"no signing key", map[string]string{"GDR_ASSIGNMENT_SIGNING_KEY": ""}, "GDR_ASSIGNMENT_SIGNING_KEY"},
		{"negative busy interval", map[string]string{"GDR_BUSY_POLL_INTERVAL": "-1s"}, "GDR_BUSY_POLL_INTERVAL -1s"},
		{"negative busy window", map[string]string{"GDR_BUSY_WINDOW": "-1s"}, "none may be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range base {
				t.Setenv(k, v)
			}
			for k, v := range tc.set {
				t.Setenv(k, v)
			}
			cfg, err := loadConfig()
			ps := cfg.pools
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if len(ps) != 1 || ps[0].Credentials != filepath.Join(dir, "linux.json") || ps.PayloadTTL() != 3*time.Hour || cfg.KeepAlive != time.Minute {
					t.Fatalf("config = %+v, pools = %+v", cfg, ps)
				}
				// serve polls on its own, at the interval whose cost was
				// measured, besides the webhook.
				if cfg.Interval != dispatcher.DefaultPollInterval {
					t.Fatalf("GDR_POLL_INTERVAL defaults to %v, want %v", cfg.Interval, dispatcher.DefaultPollInterval)
				}
				if cfg.BusyInterval != dispatcher.DefaultBusyInterval || cfg.BusyWindow != dispatcher.DefaultBusyWindow {
					t.Fatalf("GDR_BUSY_POLL_INTERVAL, GDR_BUSY_WINDOW default to %v, %v, want %v, %v", cfg.BusyInterval, cfg.BusyWindow,
						dispatcher.DefaultBusyInterval, dispatcher.DefaultBusyWindow)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("loadConfig() error = %v, want it to mention %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), testKey) {
				t.Fatalf("the error shows the key: %v", err)
			}
		})
	}
}

// loadConfig loads the configuration as main does for `dispatch run`, from
// the environment.
func loadConfig() (Config, error) {
	var c Config
	_, err := program.Load(&c, []string{"run"}, io.Discard)
	return c, err
}
