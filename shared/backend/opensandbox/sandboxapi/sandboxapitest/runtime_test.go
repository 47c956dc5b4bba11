package sandboxapitest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
)

// status is a sandbox's status as GET answers it, or the error body.
type status struct {
	Code, State, Reason, Message string
}

func getStatus(t *testing.T, fake *sandboxapitest.Server, id string) (int, status) {
	t.Helper()
	code, body := do(t, fake, "GET", "/v1/sandboxes/"+id, "")
	var v struct {
		Status  struct{ State, Reason, Message string }
		Code    string
		Message string
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("GET %s: %d %s: %v", id, code, body, err)
	}
	if code != http.StatusOK {
		return code, status{Code: v.Code, Message: v.Message}
	}
	return code, status{State: v.Status.State, Reason: v.Status.Reason, Message: v.Status.Message}
}

// listed returns the IDs List finds by metadata md.
func listed(t *testing.T, fake *sandboxapitest.Server, md string) []string {
	t.Helper()
	code, body := do(t, fake, "GET", "/v1/sandboxes?metadata="+url.QueryEscape(md), "")
	var v struct{ Items []struct{ ID string } }
	if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil {
		t.Fatalf("list: %d %s: %v", code, body, err)
	}
	var ids []string
	for _, it := range v.Items {
		ids = append(ids, it.ID)
	}
	return ids
}

// On the Docker runtime an exited entrypoint leaves the sandbox Terminated
// or Failed, listed, until it expires; then it is gone, never Terminated.
func TestExitThenExpireDocker(t *testing.T) {
	tests := []struct {
		code int
		want status
	}{
		{0, status{State: "Terminated", Reason: "CONTAINER_EXITED", Message: "Sandbox container exited successfully."}},
		{1, status{State: "Failed", Reason: "CONTAINER_EXITED_ERROR", Message: "Sandbox container exited with code 1."}},
		{137, status{State: "Failed", Reason: "CONTAINER_EXITED_ERROR", Message: "Sandbox container exited with code 137."}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("exit ", tt.code), func(t *testing.T) {
			fake := sandboxapitest.New(t)
			id := create(t, fake, image+`,"timeout":600,"metadata":{"k":"v"}`)
			if code, got := getStatus(t, fake, id); code != 200 || got != (status{State: "Running", Reason: "CONTAINER_RUNNING", Message: "Sandbox container is running."}) {
				t.Fatalf("before the exit: %d %+v", code, got)
			}
			fake.Exit(id, tt.code)
			if code, got := getStatus(t, fake, id); code != 200 || got != tt.want {
				t.Fatalf("after the exit: %d %+v, want %+v", code, got, tt.want)
			}
			if ids := listed(t, fake, "k=v"); len(ids) != 1 || ids[0] != id {
				t.Fatalf("listed after the exit: %v, want %s", ids, id)
			}
			fake.Expire(id)
			gone := status{Code: "DOCKER::SANDBOX_NOT_FOUND", Message: "Sandbox " + id + " not found."}
			if code, got := getStatus(t, fake, id); code != 404 || got != gone {
				t.Fatalf("after the expiry: %d %+v, want 404 %+v", code, got, gone)
			}
			if ids := listed(t, fake, "k=v"); len(ids) != 0 {
				t.Fatalf("listed after the expiry: %v", ids)
			}
			if code, _ := do(t, fake, "DELETE", "/v1/sandboxes/"+id, ""); code != 404 {
				t.Fatalf("DELETE after the expiry: %d, want 404", code)
			}
			if _, ok := fake.Sandbox(id); ok || len(fake.Created()) != 1 {
				t.Fatalf("Sandbox still finds it, or Created %v lost it", fake.Created())
			}
		})
	}
}

// A sandbox is removed when its timeout passes in real time, too.
func TestExpiresInRealTime(t *testing.T) {
	fake := sandboxapitest.New(t)
	// Seed skips the specification's 60 s minimum.
	id := fake.Seed([]byte(`{` + image + `,"timeout":1,"metadata":{"k":"v"}}`))
	if code, _ := getStatus(t, fake, id); code != 200 {
		t.Fatalf("GET before the expiry: %d", code)
	}
	time.Sleep(1100 * time.Millisecond)
	if code, got := getStatus(t, fake, id); code != 404 || got.Code != "DOCKER::SANDBOX_NOT_FOUND" {
		t.Fatalf("GET after the expiry: %d %+v, want 404", code, got)
	}
	if ids := listed(t, fake, "k=v"); len(ids) != 0 || len(fake.Sandboxes()) != 0 {
		t.Fatalf("listed after the expiry: %v", ids)
	}
}

func TestMaxTimeout(t *testing.T) {
	tests := []struct {
		name    string
		opts    []sandboxapitest.Option
		timeout int
		want    string // the 400's message, "" for a 202
	}{
		{"default max", nil, 86400, ""},
		{"above the default max", nil, 86401, "Sandbox timeout 86401s exceeds configured maximum of 86400s."},
		{"configured max", []sandboxapitest.Option{sandboxapitest.WithMaxTimeout(time.Hour)}, 3600, ""},
		{"above the configured max", []sandboxapitest.Option{sandboxapitest.WithMaxTimeout(time.Hour)}, 3601, "Sandbox timeout 3601s exceeds configured maximum of 3600s."},
		{"on Kubernetes too", []sandboxapitest.Option{sandboxapitest.WithRuntime(sandboxapitest.Kubernetes)}, 90000, "Sandbox timeout 90000s exceeds configured maximum of 86400s."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := sandboxapitest.New(t, tt.opts...)
			code, body := do(t, fake, "POST", "/v1/sandboxes", fmt.Sprintf(`{%s,"timeout":%d}`, image, tt.timeout))
			if tt.want == "" {
				if code != http.StatusAccepted {
					t.Fatalf("create: %d %s, want 202", code, body)
				}
				return
			}
			want := `{"code":"SANDBOX::INVALID_PARAMETER","message":"` + tt.want + `"}`
			if code != http.StatusBadRequest || body != want || fake.Creates() != 0 {
				t.Fatalf("create: %d %s (creates %d), want 400 %s", code, body, fake.Creates(), want)
			}
		})
	}
}

// The Kubernetes runtime: create answers 202 Running; an exited entrypoint
// is restarted, so the sandbox shows Pending and then, for good, Failed by
// CrashLoopBackOff, never Terminated; an expired one is gone with the
// provider's code.
func TestKubernetesRuntime(t *testing.T) {
	for _, code := range []int{0, 1} {
		t.Run(fmt.Sprint("exit ", code), func(t *testing.T) {
			backOff := 200 * time.Millisecond
			fake := sandboxapitest.New(t, sandboxapitest.WithRuntime(sandboxapitest.Kubernetes), sandboxapitest.WithCrashLoopBackOff(backOff))
			st, body := do(t, fake, "POST", "/v1/sandboxes", `{`+image+`,"timeout":600}`)
			var created struct {
				ID     string
				Status status
			}
			if err := json.Unmarshal([]byte(body), &created); err != nil || st != http.StatusAccepted ||
				created.Status != (status{State: "Running", Reason: "RUNNING", Message: "Sandbox is running"}) {
				t.Fatalf("create: %d %s", st, body)
			}
			id := created.ID
			exited := time.Now()
			fake.Exit(id, code)
			pending := status{State: "Pending", Reason: "CREATING", Message: "Sandbox is being created"}
			if st, got := getStatus(t, fake, id); st != 200 || got != pending {
				if time.Since(exited) < backOff {
					t.Fatalf("after the exit: %d %+v, want %+v", st, got, pending)
				}
			}
			time.Sleep(backOff)
			failed := status{State: "Failed", Reason: "FAILED", Message: "1/1 observed pods failed; primary reason=CrashLoopBackOff; sample pod=" + id + "-0"}
			if st, got := getStatus(t, fake, id); st != 200 || got != failed {
				t.Fatalf("after the back-off: %d %+v, want %+v", st, got, failed)
			}
			fake.Exit(id, code) // restarted and exited again: still Failed
			if _, got := getStatus(t, fake, id); got != failed {
				t.Fatalf("after another exit: %+v, want %+v", got, failed)
			}
			fake.Expire(id)
			gone := status{Code: "KUBERNETES::SANDBOX_NOT_FOUND", Message: "Sandbox '" + id + "' not found"}
			if st, got := getStatus(t, fake, id); st != 404 || got != gone {
				t.Fatalf("after the expiry: %d %+v, want 404 %+v", st, got, gone)
			}
		})
	}
}

// A create that times out waiting for the Pod answers 504
// KUBERNETES::POD_READY_TIMEOUT (retryable for the client); the sandbox it
// created stays (to be found by its metadata) or is removed.
func TestPodReadyTimeout(t *testing.T) {
	for _, keep := range []bool{true, false} {
		t.Run(fmt.Sprint("keep ", keep), func(t *testing.T) {
			fake := sandboxapitest.New(t, sandboxapitest.WithRuntime(sandboxapitest.Kubernetes))
			c, err := sandboxapi.New(sandboxapi.Options{BaseURL: fake.URL})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			md := map[string]string{"ci.example.org/assignment": "a1"}
			req := sandboxapi.CreateRequest{Image: "runner:1", Entrypoint: []string{"/runner"},
				ResourceLimits: map[string]string{"cpu": "1"}, Timeout: time.Hour, Metadata: md}
			fake.InjectPodReadyTimeout(keep)
			_, err = c.Create(ctx, req)
			var apiErr *sandboxapi.APIError
			if !errors.As(err, &apiErr) || apiErr.Status != http.StatusGatewayTimeout || apiErr.Code != "KUBERNETES::POD_READY_TIMEOUT" || !sandboxapi.Retryable(err) {
				t.Fatalf("create: %v, want a retryable 504 KUBERNETES::POD_READY_TIMEOUT", err)
			}
			if fake.Creates() != 1 || len(fake.Created()) != 1 {
				t.Fatalf("creates %d, want 1", fake.Creates())
			}
			found, err := c.List(ctx, sandboxapi.ListFilter{Metadata: md})
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case keep && (len(found) != 1 || found[0].ID != fake.Created()[0].ID || found[0].State != sandboxapi.StatePending):
				t.Fatalf("kept: List found %+v, want the created sandbox Pending", found)
			case !keep && len(found) != 0:
				t.Fatalf("removed: List found %+v", found)
			}
			if sb, err := c.Create(ctx, req); err != nil || sb.State != sandboxapi.StateRunning {
				t.Fatalf("the next create: %+v %v, want Running (one fault injected)", sb, err)
			}
		})
	}
	t.Run("Docker never answers it", func(t *testing.T) {
		rec := &recordingTB{TB: t}
		fake := sandboxapitest.New(rec)
		func() {
			defer func() { _ = recover() }() // FailNow of the recorder
			fake.InjectPodReadyTimeout(true)
		}()
		if !rec.failed {
			t.Fatal("InjectPodReadyTimeout accepted on the Docker runtime")
		}
	})
}

// The Kubernetes runtime answers a sandbox from its BatchSandbox: GET and
// List show the container's command (bootstrap.sh, then the entrypoint
// asked for), createdAt in whole seconds, and lastTransitionAt always the
// creation, also after an exit changed the state; the create's answer shows
// the entrypoint as asked (docs/OPENSANDBOX-KUBERNETES.md).
func TestKubernetesSandboxFields(t *testing.T) {
	fake := sandboxapitest.New(t, sandboxapitest.WithRuntime(sandboxapitest.Kubernetes), sandboxapitest.WithCrashLoopBackOff(0))
	type fields struct {
		ID         string
		Entrypoint []string
		CreatedAt  string
		Status     struct{ State, LastTransitionAt string }
	}
	code, body := do(t, fake, "POST", "/v1/sandboxes", `{"image":{"uri":"img:1"},"entrypoint":["/bin/sh","-c","sleep 9"],"resourceLimits":{"cpu":"100m"},"timeout":600,"metadata":{"k":"v"}}`)
	var created fields
	if err := json.Unmarshal([]byte(body), &created); code != http.StatusAccepted || err != nil {
		t.Fatalf("create: %d %s: %v", code, body, err)
	}
	if fmt.Sprint(created.Entrypoint) != "[/bin/sh -c sleep 9]" {
		t.Errorf("create's entrypoint %q, want as asked", created.Entrypoint)
	}
	fake.Exit(created.ID, 1)
	_, body = do(t, fake, "GET", "/v1/sandboxes/"+created.ID, "")
	var got fields
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.State != "Failed" {
		t.Fatalf("after the exit: %s, want Failed", body)
	}
	if fmt.Sprint(got.Entrypoint) != "[/opt/opensandbox/bootstrap.sh /bin/sh -c sleep 9]" {
		t.Errorf("GET's entrypoint %q, want bootstrap.sh before the one asked for", got.Entrypoint)
	}
	at, err := time.Parse(time.RFC3339Nano, got.CreatedAt)
	if err != nil || !at.Equal(at.Truncate(time.Second)) {
		t.Errorf("GET's createdAt %q (%v), want whole seconds", got.CreatedAt, err)
	}
	if got.Status.LastTransitionAt != got.CreatedAt {
		t.Errorf("GET's lastTransitionAt %q after a change of state, want the creation %q", got.Status.LastTransitionAt, got.CreatedAt)
	}
}
