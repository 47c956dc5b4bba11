package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dispatch serve without a webhook secret would let anyone who reaches it
// start rounds: it refuses to start (exit 2, before any connection) unless
// unsigned deliveries are accepted explicitly.
func TestServeRefusesUnsignedWebhooksByDefault(t *testing.T) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"GDR_GITEA_URL": "http://127.0.0.1:1/", "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir,
		"GDR_TRUST_DOMAIN": "ci.example.org", "GDR_PAYLOAD_KEY": testKey,
		"GDR_ASSIGNMENT_SIGNING_KEY": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=",
		"GDR_NATS_URL":               "nats://127.0.0.1:1", // a start that gets past the gate fails later, with 1
	} {
		t.Setenv(k, v)
	}
	for _, tc := range []struct {
		name     string
		env      map[string]string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"serve without a secret", nil, []string{"serve"}, 2, "GDR_WEBHOOK_SECRET is not set"},
		{"serve, unsigned accepted explicitly", map[string]string{"GDR_ALLOW_UNSIGNED_WEBHOOKS": "true"}, []string{"serve"}, 1, "dispatch could not start"},
		{"serve with a secret", map[string]string{"GDR_WEBHOOK_SECRET": "s"}, []string{"serve"}, 1, "dispatch could not start"},
		{"run needs no secret", nil, []string{"run"}, 1, "dispatch could not start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out bytes.Buffer
			if code := execute(context.Background(), tc.args, &out); code != tc.wantCode || !strings.Contains(out.String(), tc.wantOut) {
				t.Fatalf("dispatch %v = %d, want %d with %q; stderr:\n%s", tc.args, code, tc.wantCode, tc.wantOut, out.String())
			}
		})
	}
}
