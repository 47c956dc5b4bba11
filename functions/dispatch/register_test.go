package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRegisterNeedsOnlyGiteaPoolsAndToken runs `dispatch register` as deploy/README.md's install
// does, before any key is in the cluster: with Gitea's address, the pools file, the state
// folder and the token set, and no key, NATS or SPIRE setting. It must get as far as asking
// Gitea (here a server that refuses: exit 1 naming the pool), not stop at the configuration
// (exit 2, "required variables not set: GDR_ASSIGNMENT_SIGNING_KEY", what the install met
// before register had its own configuration). Without a token it says which is missing.
func TestRegisterNeedsOnlyGiteaPoolsAndToken(t *testing.T) {
	var asked int
	gitea := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked++
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer gitea.Close()
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - name: linux\n    labels: [ubuntu-latest]\n    backend: process\n    capacity: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, token string
		want        string
		code        int
		asks        bool
	}{
		{"with a token", "a-token", "pool linux", 1, true},
		{"without", "", "pool linux: GDR_REGISTRATION_TOKEN is not set", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked = 0
			for _, kv := range os.Environ() {
				if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "GDR_") {
					t.Setenv(k, "")
					os.Unsetenv(k)
				}
			}
			t.Setenv("GDR_GITEA_URL", gitea.URL+"/")
			t.Setenv("GDR_POOLS_FILE", pools)
			t.Setenv("GDR_STATE_DIR", filepath.Join(dir, "state-"+strings.ReplaceAll(tc.name, " ", "-")))
			t.Setenv("GDR_REGISTRATION_TOKEN", tc.token)
			var stdout, stderr bytes.Buffer
			code := executeTo(context.Background(), []string{"register"}, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, %q; want %d naming %q", code, stderr.String(), tc.code, tc.want)
			}
			if strings.Contains(stderr.String(), "configuration") {
				t.Errorf("register stopped at the configuration: %q", stderr.String())
			}
			if (asked > 0) != tc.asks {
				t.Errorf("Gitea asked %d times, want asked: %v", asked, tc.asks)
			}
		})
	}
}
