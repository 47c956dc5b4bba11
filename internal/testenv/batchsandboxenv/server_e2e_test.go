//go:build e2e

package batchsandboxenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/opensandboxenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
)

// serverNamespace is where the lifecycle server creates its BatchSandboxes.
const serverNamespace = "opensandbox"

// serverWorld is a cluster with the manager, the images and the lifecycle
// server of the Kubernetes runtime.
type serverWorld struct {
	c    *clusterenv.Cluster
	s    *opensandboxenv.Server
	kube kubernetes.Interface
	dyn  dynamic.Interface
}

func startServerWorld(ctx context.Context, t *testing.T) *serverWorld {
	t.Helper()
	c, s := StartWorld(ctx, t, serverNamespace)
	dyn, err := dynamic.NewForConfig(c.Plane.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return &serverWorld{c: c, s: s, kube: c.Client(t), dyn: dyn}
}

// raw sends one request to the server as it is and returns the status and
// body, logged as observed.
func (w *serverWorld) raw(ctx context.Context, t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, w.s.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(sandboxapi.APIKeyHeader, w.s.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	t.Logf("observed: %s %s -> %d %s", method, path, resp.StatusCode, b)
	return resp.StatusCode, string(b)
}

// rawStatus is the parts of a Sandbox, CreateSandboxResponse or
// ErrorResponse body the test looks at.
type rawStatus struct {
	ID        string    `json:"id"`
	ExpiresAt time.Time `json:"expiresAt"`
	Status    struct {
		State, Reason, Message string
	} `json:"status"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func parseRaw(t *testing.T, body string) rawStatus {
	t.Helper()
	var v rawStatus
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("answer %q: %v", body, err)
	}
	return v
}

// createBody is a create request of SandboxImage running cmd with sh.
func createBody(cmd string, timeout int, md map[string]string) string {
	m, _ := json.Marshal(md)
	return fmt.Sprintf(`{"image":{"uri":%q},"entrypoint":["/bin/sh","-c",%q],`+
		`"resourceLimits":{"cpu":"100m","memory":"64Mi"},"timeout":%d,"metadata":%s}`, SandboxImage, cmd, timeout, m)
}

// goneWithin waits until the BatchSandbox id and its Pod id-0 are both
// NotFound, failing t after d.
func (w *serverWorld) goneWithin(ctx context.Context, t *testing.T, id string, d time.Duration) {
	t.Helper()
	start := time.Now()
	var bsGone, podGone time.Duration
	for time.Since(start) < d {
		if bsGone == 0 {
			if _, err := w.dyn.Resource(batchSandboxes).Namespace(serverNamespace).Get(ctx, id, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				bsGone = time.Since(start)
			}
		}
		if podGone == 0 {
			if _, err := w.kube.CoreV1().Pods(serverNamespace).Get(ctx, id+"-0", metav1.GetOptions{}); apierrors.IsNotFound(err) {
				podGone = time.Since(start)
			}
		}
		if bsGone > 0 && podGone > 0 {
			t.Logf("observed: BatchSandbox %s NotFound after %s, its Pod after %s", id, bsGone.Round(10*time.Millisecond), podGone.Round(10*time.Millisecond))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("after %s: BatchSandbox %s gone=%v, Pod %s-0 gone=%v; want both gone", d, id, bsGone > 0, id, podGone > 0)
}

// TestE2EOpenSandboxKubernetesServer runs OpenSandbox's real lifecycle
// server with `[runtime] type = "kubernetes"` (provider batchsandbox)
// against a real single-node cluster with the BatchSandbox controller, and
// checks what it answers, through our client and raw HTTP
// (docs/OPENSANDBOX-KUBERNETES.md, "The lifecycle server against this
// cluster"):
//   - Running: create of `tail -f /dev/null` answers 202 Running (after the
//     Pod is Ready); the BatchSandbox is named by the sandbox's ID and its
//     Pod <id>-0 runs; GET answers Running with the metadata and image;
//     List by the metadata finds it alone; DELETE answers 204 and no body,
//     then GET 404 KUBERNETES::SANDBOX_NOT_FOUND, the client's Delete nil,
//     and the BatchSandbox and its Pod are gone.
//   - Exit: an entrypoint `sleep 2; exit 1` turns Pending (CREATING) and then
//     Failed (FAILED, CrashLoopBackOff) within a minute and stays Failed;
//     it is never Terminated.
//   - Expiry: at expiresAt (60 s) GET answers 404, not before, and the
//     BatchSandbox and Pod are gone.
func TestE2EOpenSandboxKubernetesServer(t *testing.T) {
	// Its timeout starts once a cluster slot is its (clusterenv.Reserve).
	ctx, cancel := context.WithTimeout(clusterenv.Reserve(context.Background(), t), 12*time.Minute)
	defer cancel()
	w := startServerWorld(ctx, t)
	c, err := sandboxapi.New(sandboxapi.Options{BaseURL: w.s.URL, APIKey: w.s.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	run := fmt.Sprintf("k%d", time.Now().UnixNano())
	start := time.Now()
	defer func() { t.Logf("the server's cases took %s", time.Since(start).Round(time.Second)) }()

	t.Run("cases", func(t *testing.T) {
		t.Run("Running", func(t *testing.T) {
			t.Parallel()
			md := map[string]string{"gdr-run": run, "gdr-case": "running"}
			t0 := time.Now()
			code, body := w.raw(ctx, t, http.MethodPost, "/v1/sandboxes", createBody("tail -f /dev/null", 90, md))
			created := parseRaw(t, body)
			t.Logf("observed: create answered after %s", time.Since(t0).Round(time.Millisecond))
			if code != http.StatusAccepted || created.ID == "" || created.Status.State != "Running" {
				t.Fatalf("create: %d %s, want 202 with a Running sandbox", code, body)
			}
			id := created.ID
			if left := time.Until(created.ExpiresAt); left < 80*time.Second || left > 91*time.Second {
				t.Errorf("create: expiresAt %s is %s away, want about 90 s", created.ExpiresAt, left)
			}
			bs, err := w.dyn.Resource(batchSandboxes).Namespace(serverNamespace).Get(ctx, id, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the BatchSandbox named by the sandbox's ID: %v", err)
			}
			t.Logf("observed: BatchSandbox %s: labels %v, spec.expireTime %v", id, bs.GetLabels(), bs.Object["spec"].(map[string]any)["expireTime"])
			pod, err := w.kube.CoreV1().Pods(serverNamespace).Get(ctx, id+"-0", metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the sandbox's Pod: %v", err)
			}
			if !podReady(pod) {
				t.Errorf("Pod %s is not Ready when create answered: %s", pod.Name, pod.Status.Phase)
			}

			got, err := c.Get(ctx, id)
			if err != nil {
				t.Fatalf("client Get: %v", err)
			}
			t.Logf("observed: client Get: state %s reason %q message %q image %q metadata %v", got.State, got.Reason, got.Message, got.Image, got.Metadata)
			if got.State != sandboxapi.StateRunning || got.Metadata["gdr-run"] != run || got.Image != SandboxImage {
				t.Errorf("client Get: %+v, want Running with gdr-run=%s and image %s", got, run, SandboxImage)
			}
			w.raw(ctx, t, http.MethodGet, "/v1/sandboxes/"+id, "")

			list, err := c.List(ctx, sandboxapi.ListFilter{Metadata: md})
			if err != nil {
				t.Fatalf("client List: %v", err)
			}
			if len(list) != 1 || list[0].ID != id || list[0].State != sandboxapi.StateRunning {
				t.Errorf("client List by metadata: %+v, want only %s, Running", list, id)
			}
			w.raw(ctx, t, http.MethodGet, "/v1/sandboxes?metadata="+url.QueryEscape(sandboxapi.MetadataFilter(md)), "")

			code, body = w.raw(ctx, t, http.MethodDelete, "/v1/sandboxes/"+id, "")
			if code != http.StatusNoContent || body != "" {
				t.Errorf("DELETE: %d %q, want 204 and no body", code, body)
			}
			code, body = w.raw(ctx, t, http.MethodGet, "/v1/sandboxes/"+id, "")
			if e := parseRaw(t, body); code != http.StatusNotFound || e.Code != "KUBERNETES::SANDBOX_NOT_FOUND" || e.Message != fmt.Sprintf("Sandbox '%s' not found", id) {
				t.Errorf("GET after DELETE: %d %s, want 404 KUBERNETES::SANDBOX_NOT_FOUND", code, body)
			}
			if _, err := c.Get(ctx, id); !sandboxapi.IsNotFound(err) {
				t.Errorf("client Get after DELETE: %v, want a not-found error", err)
			}
			if err := c.Delete(ctx, id); err != nil {
				t.Errorf("client Delete of the deleted sandbox: %v, want nil (deleted already)", err)
			}
			w.goneWithin(ctx, t, id, 30*time.Second)
		})

		t.Run("Exit", func(t *testing.T) {
			t.Parallel()
			md := map[string]string{"gdr-run": run, "gdr-case": "exit"}
			t0 := time.Now()
			sb, err := c.Create(ctx, sandboxapi.CreateRequest{
				Image: SandboxImage, Entrypoint: []string{"/bin/sh", "-c", "sleep 2; exit 1"},
				ResourceLimits: map[string]string{"cpu": "100m", "memory": "64Mi"}, Timeout: 3 * time.Minute, Metadata: md,
			})
			if err != nil {
				t.Fatalf("client Create: %v", err)
			}
			defer func() { _ = c.Delete(context.Background(), sb.ID) }()
			t.Logf("observed: +%s create: %s (%s) %q", time.Since(t0).Round(100*time.Millisecond), sb.State, sb.Reason, sb.Message)
			if sb.State != sandboxapi.StateRunning {
				t.Errorf("create: %s, want Running", sb.State)
			}
			var seen []string
			last := ""
			var failedAt time.Time
			for time.Since(t0) < 75*time.Second {
				got, err := c.Get(ctx, sb.ID)
				if err != nil {
					t.Fatalf("client Get: %v", err)
				}
				now := fmt.Sprintf("%s (%s) %q", got.State, got.Reason, got.Message)
				if now != last {
					t.Logf("observed: +%s %s", time.Since(t0).Round(100*time.Millisecond), now)
					seen = append(seen, string(got.State)+"/"+got.Reason)
					last = now
				}
				if got.State == sandboxapi.StateTerminated {
					t.Errorf("the sandbox turned Terminated: %s", now)
				}
				if got.State == sandboxapi.StateFailed && failedAt.IsZero() {
					failedAt = time.Now()
					if got.Reason != "FAILED" || !strings.Contains(got.Message, "primary reason=CrashLoopBackOff") ||
						!strings.HasSuffix(got.Message, "sample pod="+sb.ID+"-0") {
						t.Errorf("Failed: %s, want reason FAILED and the CrashLoopBackOff message", now)
					}
				}
				if !failedAt.IsZero() && time.Since(failedAt) > 5*time.Second {
					break // Failed is sticky: watched for 5 s more
				}
				time.Sleep(250 * time.Millisecond)
			}
			if failedAt.IsZero() {
				t.Fatalf("not Failed %s after create; seen %v", time.Since(t0).Round(time.Second), seen)
			}
			t.Logf("observed: Failed %s after create; states seen %v", failedAt.Sub(t0).Round(100*time.Millisecond), seen)
			if d := failedAt.Sub(t0); d > 60*time.Second {
				t.Errorf("Failed %s after create, want within 60 s", d)
			}
			pendingBeforeFailed := false
			for _, s := range seen {
				if s == "Pending/CREATING" {
					pendingBeforeFailed = true
				}
				if strings.HasPrefix(s, "Failed/") {
					break
				}
			}
			if !pendingBeforeFailed {
				t.Errorf("no Pending (CREATING) before Failed: %v", seen)
			}
			if s := seen[len(seen)-1]; s != "Failed/FAILED" {
				t.Errorf("last state %s, want Failed/FAILED (sticky)", s)
			}
			list, err := c.List(ctx, sandboxapi.ListFilter{Metadata: md})
			if err != nil || len(list) != 1 || list[0].State != sandboxapi.StateFailed {
				t.Errorf("client List by metadata: %+v %v, want the Failed sandbox", list, err)
			}
		})

		t.Run("Expiry", func(t *testing.T) {
			t.Parallel()
			md := map[string]string{"gdr-run": run, "gdr-case": "expiry"}
			code, body := w.raw(ctx, t, http.MethodPost, "/v1/sandboxes", createBody("tail -f /dev/null", 60, md))
			created := parseRaw(t, body)
			if code != http.StatusAccepted || created.ID == "" || created.ExpiresAt.IsZero() {
				t.Fatalf("create: %d %s, want 202 with an id and expiresAt", code, body)
			}
			id := created.ID
			var goneAt time.Time
			for time.Until(created.ExpiresAt) > -30*time.Second {
				_, err := c.Get(ctx, id)
				if sandboxapi.IsNotFound(err) {
					goneAt = time.Now()
					break
				}
				if err != nil {
					t.Fatalf("client Get: %v", err)
				}
				time.Sleep(250 * time.Millisecond)
			}
			if goneAt.IsZero() {
				t.Fatalf("still there 30 s after expiresAt %s", created.ExpiresAt)
			}
			early := created.ExpiresAt.Sub(goneAt)
			t.Logf("observed: GET answered 404 %s after expiresAt (%s)", -early.Round(10*time.Millisecond), created.ExpiresAt.Format(time.RFC3339Nano))
			if early > time.Second {
				t.Errorf("gone %s before its expiresAt", early)
			}
			code, body = w.raw(ctx, t, http.MethodGet, "/v1/sandboxes/"+id, "")
			if e := parseRaw(t, body); code != http.StatusNotFound || e.Code != "KUBERNETES::SANDBOX_NOT_FOUND" {
				t.Errorf("GET after expiry: %d %s, want 404 KUBERNETES::SANDBOX_NOT_FOUND", code, body)
			}
			w.goneWithin(ctx, t, id, 30*time.Second)
		})
	})

	// Every sandbox of the cases is gone (deleted or expired).
	list, err := c.List(ctx, sandboxapi.ListFilter{Metadata: map[string]string{"gdr-run": run}})
	if err != nil {
		t.Fatalf("client List: %v", err)
	}
	t.Logf("observed: List of the run after the cases: %d sandboxes", len(list))
	if len(list) != 0 {
		t.Errorf("List of the run after the cases: %+v, want none", list)
	}
}
