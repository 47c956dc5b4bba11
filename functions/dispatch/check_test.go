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

	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
)

// `dispatch check` (helm test's): one line per question, exit 0 only when Gitea accepts every
// pool's registration and NATS has the assignments' stream; a password in a URL and the
// runner's token never printed.
func TestCheck(t *testing.T) {
	d := &declareOnly{}
	mux := http.NewServeMux()
	path, h := runnerv1connect.NewRunnerServiceHandler(d)
	mux.Handle("/api/actions"+path, http.StripPrefix("/api/actions", h))
	up := httptest.NewServer(mux)
	t.Cleanup(up.Close)
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "bad gateway", http.StatusBadGateway)
	}))
	t.Cleanup(down.Close)

	dir := t.TempDir()
	poolsFile := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(poolsFile, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := (gitea.FileStore{Path: filepath.Join(dir, "linux.json")}).Save(gitea.Credentials{ID: 1, UUID: "u", Token: "runner-token-secret"}); err != nil {
		t.Fatal(err)
	}
	_, bare := jetstreamenv.Start(t)       // no stream
	withStream := jetstreamenv.NewQueue(t) // the assignments' stream, as handle's setup makes it
	withPassword := func(u string) string { return strings.Replace(u, "nats://", "nats://dispatch:nats-password@", 1) }
	for _, tc := range []struct {
		name, gitea, nats string
		wantCode          int
		want              []string
	}{
		{"ready", up.URL + "/", withPassword(withStream.URL), 0, []string{
			"gitea " + up.URL + "/: pool linux: ok",
			"nats " + strings.Replace(withStream.URL, "nats://", "nats://dispatch:xxxxx@", 1) + ": user dispatch: ok",
			": stream CI_RUNNER: ok",
		}},
		{"no stream", up.URL + "/", bare, 1, []string{"user dispatch: ok", ": stream CI_RUNNER: nats: API error: code=404"}},
		{"gitea fails", down.URL + "/", withStream.URL, 1, []string{"gitea " + down.URL + "/: pool linux: gitea Declare: unavailable", ": stream CI_RUNNER: ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range map[string]string{
				"GDR_GITEA_URL": tc.gitea, "GDR_POOLS_FILE": poolsFile, "GDR_STATE_DIR": dir, "GDR_NATS_URL": tc.nats,
			} {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := executeTo(context.Background(), []string{"check"}, &stdout, &stderr)
			out := stdout.String()
			t.Logf("%s", out)
			if code != tc.wantCode {
				t.Fatalf("dispatch check exited %d, want %d:\n%s%s", code, tc.wantCode, out, stderr.String())
			}
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("the report lacks %q:\n%s", want, out)
				}
			}
			for _, secret := range []string{"nats-password", "runner-token-secret"} {
				if strings.Contains(out+stderr.String(), secret) {
					t.Errorf("the output shows %q:\n%s%s", secret, out, stderr.String())
				}
			}
		})
	}
}
