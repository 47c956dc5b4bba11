//go:build e2e

package opensandboxenv_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/opensandboxenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
)

// raw sends one request to the server as it is and returns the status and
// body, for the answers docs/OPENSANDBOX.md records.
func raw(t *testing.T, s *opensandboxenv.Server, method, path, body string, key bool) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key {
		req.Header.Set(sandboxapi.APIKeyHeader, s.APIKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	t.Logf("observed: %s %s -> %d %s", method, path, resp.StatusCode, b)
	return resp.StatusCode, string(b)
}

// errorCode is the "code" of an ErrorResponse body, "" if it has none.
func errorCode(body string) string {
	var e struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	return e.Code
}

func TestE2EOpenSandboxDockerServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := opensandboxenv.Start(ctx, t, opensandboxenv.Options{})
	c, err := sandboxapi.New(sandboxapi.Options{BaseURL: s.URL, APIKey: s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	limits := map[string]string{"cpu": "500m", "memory": "256Mi"}
	run := fmt.Sprintf("gdr-e2e-%d", time.Now().UnixNano())

	t.Run("Health", func(t *testing.T) {
		if code, _ := raw(t, s, http.MethodGet, "/health", "", false); code != http.StatusOK {
			t.Errorf("GET /health: %d, want 200", code)
		}
		if code, _ := raw(t, s, http.MethodGet, "/v1/sandboxes", "", false); code != http.StatusUnauthorized {
			t.Errorf("GET /v1/sandboxes without the key: %d, want 401", code)
		}
	})

	t.Run("UnknownID", func(t *testing.T) {
		code, body := raw(t, s, http.MethodGet, "/v1/sandboxes/no-such-sandbox", "", true)
		if code != http.StatusNotFound || errorCode(body) == "" {
			t.Errorf("GET of an unknown id: %d %s, want 404 with an error code", code, body)
		}
		if _, err := c.Get(ctx, "no-such-sandbox"); !sandboxapi.IsNotFound(err) {
			t.Errorf("client Get of an unknown id: %v, want a not-found error", err)
		}
		code, body = raw(t, s, http.MethodDelete, "/v1/sandboxes/no-such-sandbox", "", true)
		t.Logf("DELETE of an unknown id: %d %s", code, body)
		if err := c.Delete(ctx, "no-such-sandbox"); err != nil {
			t.Errorf("client Delete of an unknown id: %v, want nil (deleted already)", err)
		}
	})

	t.Run("TimeoutAboveMax", func(t *testing.T) {
		req := fmt.Sprintf(`{"image":{"uri":%q},"entrypoint":["/bin/sh","-c","sleep 60"],"resourceLimits":{"cpu":"500m","memory":"256Mi"},"timeout":%d}`,
			opensandboxenv.SandboxImage, int(opensandboxenv.MaxSandboxTimeout/time.Second)+1)
		code, body := raw(t, s, http.MethodPost, "/v1/sandboxes", req, true)
		if code != http.StatusBadRequest {
			t.Errorf("create with timeout above the max: %d %s, want 400", code, body)
		}
	})

	t.Run("Lifecycle", func(t *testing.T) {
		md := map[string]string{"gdr-run": run, "gdr-case": "lifecycle"}
		t0 := time.Now()
		sb, err := c.Create(ctx, sandboxapi.CreateRequest{
			Image: opensandboxenv.SandboxImage, Entrypoint: []string{"/bin/sh", "-c", "sleep 3600"},
			ResourceLimits: limits, Timeout: 10 * time.Minute, Metadata: md,
		})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Logf("observed: create answered in %s: id %s state %s reason %q expires %s", time.Since(t0).Round(time.Millisecond), sb.ID, sb.State, sb.Reason, sb.ExpiresAt)
		got, err := c.Get(ctx, sb.ID)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if got.State != sandboxapi.StateRunning {
			t.Errorf("get: state %s (%s %s), want Running", got.State, got.Reason, got.Message)
		}
		if got.Metadata["gdr-run"] != run || got.Image != opensandboxenv.SandboxImage {
			t.Errorf("get: metadata %v image %q, want gdr-run=%s and image %s", got.Metadata, got.Image, run, opensandboxenv.SandboxImage)
		}
		raw(t, s, http.MethodGet, "/v1/sandboxes/"+sb.ID, "", true)
		// The sandbox's container runs, and holds the runner.
		if out, err := s.Docker(ctx, "ps", "--filter", "label=opensandbox.io/id="+sb.ID, "--format", "{{.ID}} {{.Image}} {{.Status}}"); err != nil {
			t.Errorf("docker ps: %v", err)
		} else {
			t.Logf("observed: docker ps for the sandbox: %s", out)
			if f := strings.Fields(string(out)); len(f) == 0 {
				t.Errorf("no running container labelled opensandbox.io/id=%s", sb.ID)
			} else if _, err := s.Docker(ctx, "exec", f[0], "test", "-x", opensandboxenv.RunnerPath); err != nil {
				t.Errorf("the runner is not an executable in the sandbox: %v", err)
			}
		}
		list, err := c.List(ctx, sandboxapi.ListFilter{Metadata: md})
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		if len(list) != 1 || list[0].ID != sb.ID {
			t.Errorf("list by metadata: %v, want exactly %s", list, sb.ID)
		}
		if code, body := raw(t, s, http.MethodDelete, "/v1/sandboxes/"+sb.ID, "", true); code != http.StatusNoContent {
			t.Errorf("DELETE: %d %s, want 204", code, body)
		}
		if err := c.Delete(ctx, sb.ID); err != nil {
			t.Fatalf("client delete of a deleted sandbox: %v, want nil", err)
		}
		if _, err := c.Get(ctx, sb.ID); !sandboxapi.IsNotFound(err) {
			t.Errorf("get after delete: %v, want a not-found error", err)
		}
		raw(t, s, http.MethodGet, "/v1/sandboxes/"+sb.ID, "", true)
		list, err = c.List(ctx, sandboxapi.ListFilter{Metadata: md})
		if err != nil || len(list) != 0 {
			t.Errorf("list after delete: %v %v, want none", list, err)
		}
	})

	// Four sandboxes watched together: the entrypoint exits 0 or 1 (with a
	// timeout long past the watch), exits 0 with a 60 s timeout (the least
	// the client sends), or runs past its 60 s timeout. Each case names the
	// state it must reach, "404" for gone.
	t.Run("Endings", func(t *testing.T) {
		cases := []struct {
			name, cmd string
			timeout   time.Duration
			want      string // a state, or "404"
		}{
			{"exit0", "sleep 2; exit 0", 10 * time.Minute, string(sandboxapi.StateTerminated)},
			{"exit1", "sleep 2; exit 1", 10 * time.Minute, string(sandboxapi.StateFailed)},
			{"exit0-expired", "sleep 2; exit 0", time.Minute, "404"},
			{"expired", "sleep 3600", time.Minute, "404"},
		}
		var wg sync.WaitGroup
		for _, tc := range cases {
			md := map[string]string{"gdr-run": run, "gdr-case": tc.name}
			sb, err := c.Create(ctx, sandboxapi.CreateRequest{
				Image: opensandboxenv.SandboxImage, Entrypoint: []string{"/bin/sh", "-c", tc.cmd},
				ResourceLimits: limits, Timeout: tc.timeout, Metadata: md,
			})
			if err != nil {
				t.Fatalf("%s: create: %v", tc.name, err)
			}
			created := time.Now()
			t.Logf("observed: %s: created %s, state %s, expires %s", tc.name, sb.ID, sb.State, sb.ExpiresAt)
			wg.Add(1)
			go func() {
				defer wg.Done()
				last := ""
				for time.Since(created) < 3*time.Minute {
					got, err := c.Get(ctx, sb.ID)
					now := string(got.State)
					detail := fmt.Sprintf("%s reason=%q message=%q", got.State, got.Reason, got.Message)
					if sandboxapi.IsNotFound(err) {
						now, detail = "404", "404"
					} else if err != nil {
						t.Errorf("%s: get: %v", tc.name, err)
						return
					}
					if detail != last {
						t.Logf("observed: %s: +%s GET: %s", tc.name, time.Since(created).Round(time.Second), detail)
						last = detail
					}
					if now == "404" && time.Now().Before(sb.ExpiresAt) {
						t.Errorf("%s: gone before it expired (%s)", tc.name, sb.ExpiresAt)
						return
					}
					if now == tc.want {
						if tc.want != "404" {
							// It stays: still listed by its metadata.
							time.Sleep(5 * time.Second)
							list, err := c.List(ctx, sandboxapi.ListFilter{Metadata: md})
							if err != nil || len(list) != 1 || list[0].State != got.State {
								t.Errorf("%s: list 5 s after it reached %s: %v %v, want it in that state", tc.name, now, list, err)
							}
						}
						raw(t, s, http.MethodGet, "/v1/sandboxes/"+sb.ID, "", true)
						return
					}
					time.Sleep(time.Second)
				}
				t.Errorf("%s: still %s 3 minutes after create, want %s", tc.name, last, tc.want)
			}()
		}
		wg.Wait()
	})

	if t.Failed() {
		t.Logf("server log:\n%s", s.ServerLog())
	}
	// Stop leaves nothing: no folder, no cgroup (Stop fails if one is left).
	if err := s.Stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("the server's folder %s is still there after Stop (%v)", s.Dir, err)
	}
}
