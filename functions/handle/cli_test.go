package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The command line follows every function's conventions, run in process:
// -h, --help and --version exit 0 without configuration; an unknown command
// is said to be one (exit 2) before any configuration is read; bad
// configuration exits 2 and says so.
func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		args     []string
		wantCode int
		want     []string // substrings of stderr
		notWant  []string
	}{
		{"help", nil, []string{"-h"}, 0, []string{"usage: handle"}, nil},
		{"long help", nil, []string{"--help"}, 0, []string{"usage: handle"}, nil},
		{"version", nil, []string{"--version"}, 0, nil, nil},
		{"unknown command", nil, []string{"nope"}, 2, []string{`handle: unknown command "nope" (handle takes none)`, "usage: handle"}, []string{"configuration"}},
		{"unknown flag", nil, []string{"--nope"}, 2, []string{"flag provided but not defined: -nope"}, nil},
		{"no configuration", nil, nil, 2, []string{"handle: configuration: required variables not set"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			if code := execute(context.Background(), tc.args, &stderr); code != tc.wantCode {
				t.Fatalf("handle %q exited %d, want %d; stderr:\n%s", tc.args, code, tc.wantCode, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(stderr.String(), w) {
					t.Errorf("stderr shows %q:\n%s", w, stderr.String())
				}
			}
		})
	}
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
