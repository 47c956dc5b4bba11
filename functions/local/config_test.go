package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
)

var update = flag.Bool("update", false, "rewrite local's table in docs/CONFIGURATION.md (make docs)")

// TestConfigurationDoc keeps local's table in docs/CONFIGURATION.md what
// envdoc renders from Config; with -update it rewrites that table.
func TestConfigurationDoc(t *testing.T) {
	if err := envdoc.Sync("../../docs/CONFIGURATION.md", "local", &Config{}, *update); err != nil {
		t.Fatal(err)
	}
}

// TestBareNamesIgnored: local reads each setting from its GDR_ name only; a
// bare MODE, BACKEND or CAPACITY in its environment changes nothing.
func TestBareNamesIgnored(t *testing.T) {
	functiontest.BareNamesIgnored(t, func() any { return &Config{} })
}

func TestLoadConfig(t *testing.T) {
	t.Setenv("GDR_CAPACITY", "3")
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withToken := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(withToken, []byte(" tok3n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var c Config
	if _, err := program.Load(&c, []string{"--gitea-url", "http://x", "--registration-token-file", withToken}, io.Discard); err != nil || c.RegistrationToken != "tok3n" {
		t.Fatalf("token from a file: %q, %v", c.RegistrationToken, err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"flags", []string{"--gitea-url", "http://127.0.0.1:3000", "--labels", "a, b"}, ""},
		{"no URL", nil, "--gitea-url"},
		{"not a URL", []string{"--gitea-url", "gitea:3000"}, "not an http(s) URL"},
		{"no labels", []string{"--gitea-url", "http://x", "--labels", " , "}, "--labels is empty"},
		{"zero capacity", []string{"--gitea-url", "http://x", "--capacity", "0"}, "--capacity 0"},
		{"token file missing", []string{"--gitea-url", "http://x", "--registration-token-file", "/nonexistent/token"}, "--registration-token-file"},
		{"token file empty", []string{"--gitea-url", "http://x", "--registration-token-file", empty}, "is empty"},
		{"bad log format", []string{"--gitea-url", "http://x", "--log-format", "yaml"}, `--log-format "yaml"`},
		{"no token flag", []string{"--gitea-url", "http://x", "--registration-token", "secret"}, "flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			_, err := program.Load(&c, tc.args, io.Discard)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.GiteaURL != "http://127.0.0.1:3000/" || c.Capacity != 3 || strings.Join(c.labels(), "|") != "a|b" || c.StateDir != "./.gdr" {
					t.Fatalf("config = %+v", c)
				}
				// Gitea is polled at the interval whose cost was measured.
				if c.PollInterval != dispatcher.DefaultPollInterval {
					t.Fatalf("GDR_POLL_INTERVAL defaults to %v, want %v", c.PollInterval, dispatcher.DefaultPollInterval)
				}
				if c.BusyPollInterval != dispatcher.DefaultBusyInterval || c.BusyWindow != dispatcher.DefaultBusyWindow {
					t.Fatalf("GDR_BUSY_POLL_INTERVAL, GDR_BUSY_WINDOW default to %v, %v, want %v, %v", c.BusyPollInterval, c.BusyWindow,
						dispatcher.DefaultBusyInterval, dispatcher.DefaultBusyWindow)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("loadConfig() error = %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}
	t.Setenv("GDR_BUSY_WINDOW", "-1s")
	if _, err := program.Load(&c, []string{"--gitea-url", "http://x"}, io.Discard); err == nil || !strings.Contains(err.Error(), "GDR_BUSY_WINDOW -1s") {
		t.Fatalf("a negative busy window: error %v, want it named", err)
	}
}

// TestUnsignedWebhooksOnlyOnLoopback: a webhook listener anyone on the
// network can reach must check Gitea's signature: without
// GDR_WEBHOOK_SECRET, --webhook-addr must be a loopback address, or
// GDR_ALLOW_UNSIGNED_WEBHOOKS=true must say unsigned deliveries are wanted
// (dispatch serve's name and meaning).
func TestUnsignedWebhooksOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr          string
		secret, allow string
		wantErr       bool
	}{
		{"0.0.0.0:8080", "", "", true},
		{":8080", "", "", true}, // every interface
		{"[::]:8080", "", "", true},
		{"192.0.2.7:8080", "", "", true},
		{"gitea-runner.example.org:8080", "", "", true}, // a name that is not localhost may resolve anywhere
		{"127.0.0.1:8080", "", "", false},
		{"127.3.4.5:8080", "", "", false},
		{"[::1]:8080", "", "", false},
		{"localhost:8080", "", "", false},
		{"0.0.0.0:8080", "hook-secret", "", false},
		{"0.0.0.0:8080", "", "true", false},
		{"0.0.0.0:8080", "", "false", true},
		{"", "", "", false}, // no webhook: poll only
	} {
		t.Run(tc.addr+"/secret="+tc.secret+"/allow="+tc.allow, func(t *testing.T) {
			for name, value := range map[string]string{"GDR_WEBHOOK_SECRET": tc.secret, "GDR_ALLOW_UNSIGNED_WEBHOOKS": tc.allow} {
				t.Setenv(name, value) // restored after the test
				if value == "" {
					_ = os.Unsetenv(name)
				}
			}
			var c Config
			_, err := program.Load(&c, []string{"--gitea-url", "http://x", "--webhook-addr", tc.addr}, io.Discard)
			if !tc.wantErr {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("unsigned deliveries accepted from the network: no error")
			}
			for _, name := range []string{"--webhook-addr " + tc.addr, "GDR_WEBHOOK_SECRET", "GDR_ALLOW_UNSIGNED_WEBHOOKS"} {
				if !strings.Contains(err.Error(), name) {
					t.Errorf("error %q does not name %s", err, name)
				}
			}
		})
	}
}
