//go:build e2e

package deploy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
)

// TestE2EDispatchTriggerReadsGiteaQueue asks a real Gitea what the shipped ScaledObject dispatch
// asks it, as KEDA's metrics-api scaler does (the trigger's URL, a bearer token, gjson, which the
// scaler evaluates valueLocation with): with one queued job naming the pool linux's label and
// one naming a label no pool has (another runner's: both wait, no runner is registered), the
// count must be 1, so the foreign job wakes nothing. The token has the one scope the docs
// give (read:admin): it must read the queue, and neither a request without it nor a write with
// it may succeed.
func TestE2EDispatchTriggerReadsGiteaQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := giteaenv.Start(t, giteaenv.Options{})
	token := g.CreateToken(t, "gdr-dispatch-wake", "read:admin")

	so := one(t, installed(loadManifests(t), "keda"), "ScaledObject", "dispatch")
	var trigger map[string]any
	for _, tr := range path(so.obj, "spec", "triggers").([]any) {
		if tr.(map[string]any)["type"] == "metrics-api" {
			trigger = tr.(map[string]any)["metadata"].(map[string]any)
		}
	}
	if trigger == nil {
		t.Fatal("ScaledObject dispatch has no metrics-api trigger")
	}
	const placeholder = "https://gitea.example.com/"
	shipped := trigger["url"].(string)
	if !strings.HasPrefix(shipped, placeholder) {
		t.Fatalf("the trigger's url %q does not start with the placeholder %q", shipped, placeholder)
	}
	url := g.URL + strings.TrimPrefix(shipped, placeholder)
	location := trigger["valueLocation"].(string)

	ours, theirs := g.CreateRepo(t, "ours"), g.CreateRepo(t, "theirs")
	g.PushWorkflow(t, ours, ".gitea/workflows/ci.yml", "on: push\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo hi\n")
	g.PushWorkflow(t, theirs, ".gitea/workflows/ci.yml", "on: push\njobs:\n  build:\n    runs-on: macos-14\n    steps:\n      - run: echo hi\n")

	get := func(auth string) (int, []byte) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	// Both jobs queued first (Gitea makes them from the pushes in the background): the fault
	// the label filter exists for is there.
	var body []byte
	for {
		code, b := get("Bearer " + token)
		if code != http.StatusOK {
			t.Fatalf("GET %s with the read:admin token: %d %s", url, code, b)
		}
		body = b
		if gjson.GetBytes(b, "total_count").Int() == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("Gitea never queued both jobs: %s", b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	v := gjson.GetBytes(body, location)
	if v.Type != gjson.Number || v.Int() != 1 {
		t.Fatalf("valueLocation %s over Gitea's answer = %s (%v), want 1 (the pool's job, not the other runner's):\n%s", location, v.Raw, v.Type, body)
	}
	if code, b := get(""); code != http.StatusUnauthorized && code != http.StatusForbidden {
		t.Errorf("the queue without a token: %d %s, want it refused", code, b)
	}
	// The token reads; it writes nothing (here: it cannot create a user).
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"api/v1/admin/users",
		strings.NewReader(`{"username":"intruder","email":"i@example.com","password":"p4ssw0rd-long"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var msg json.RawMessage
	_ = json.NewDecoder(resp.Body).Decode(&msg)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a user created with the read:admin token: status %d %s, want 403", resp.StatusCode, msg)
	}
}
