package sandboxapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
)

// fastRetry keeps retries in tests to milliseconds.
var fastRetry = sandboxapi.Retry{Attempts: 4, Initial: time.Millisecond, Max: 5 * time.Millisecond}

func newClient(t *testing.T, fake *sandboxapitest.Server, key string) *sandboxapi.Client {
	t.Helper()
	c, err := sandboxapi.New(sandboxapi.Options{BaseURL: fake.URL, APIKey: key, Retry: fastRetry})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func imageRequest(md map[string]string) sandboxapi.CreateRequest {
	return sandboxapi.CreateRequest{
		Image: "registry.example.org/runner:1", Entrypoint: []string{"/runner"},
		ResourceLimits: map[string]string{"cpu": "1", "memory": "1Gi"},
		Timeout:        time.Hour, Metadata: md,
	}
}

// noRejections fails the test if the fake refused any request: the client
// must only send what the real server accepts.
func noRejections(t *testing.T, fake *sandboxapitest.Server) {
	t.Helper()
	if r := fake.Rejections(); len(r) > 0 {
		t.Fatalf("the fake refused requests: %+v", r)
	}
}

func TestNewBaseURL(t *testing.T) {
	fake := sandboxapitest.New(t)
	tests := []struct {
		base    string
		wantErr bool
	}{
		{fake.URL, false},
		{fake.URL + "/", false},
		{fake.URL + "/v1", false},
		{fake.URL + "/v1/", false},
		{"", true},
		{"ftp://127.0.0.1/", true},
		{"127.0.0.1:8080", true},
	}
	for _, tt := range tests {
		t.Run(tt.base, func(t *testing.T) {
			c, err := sandboxapi.New(sandboxapi.Options{BaseURL: tt.base})
			if (err != nil) != tt.wantErr {
				t.Fatalf("New(%q) err = %v, want error %v", tt.base, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if _, err := c.List(context.Background(), sandboxapi.ListFilter{}); err != nil {
				t.Fatalf("List through %q: %v", tt.base, err)
			}
		})
	}
	noRejections(t, fake)
}

func TestAPIKey(t *testing.T) {
	fake := sandboxapitest.New(t, sandboxapitest.WithAPIKey("the-key"))
	tests := []struct {
		key        string
		wantStatus int
	}{
		{"the-key", 0},
		{"another-key", http.StatusUnauthorized},
		{"", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("key %q", tt.key), func(t *testing.T) {
			_, err := newClient(t, fake, tt.key).List(context.Background(), sandboxapi.ListFilter{})
			var apiErr *sandboxapi.APIError
			switch {
			case tt.wantStatus == 0 && err != nil:
				t.Fatalf("List: %v", err)
			case tt.wantStatus != 0 && (!errors.As(err, &apiErr) || apiErr.Status != tt.wantStatus):
				t.Fatalf("List: err = %v, want HTTP %d", err, tt.wantStatus)
			case tt.wantStatus != 0 && strings.Contains(err.Error(), "the-key"):
				t.Fatalf("the error shows the API key: %v", err)
			}
		})
	}
}

func TestEveryNon2xxIsAnAPIError(t *testing.T) {
	const secret = "s3cret-env-value"
	tests := []struct {
		name        string
		status      int
		body        string
		wantCode    string
		wantMessage string
		notFound    bool
		retryable   bool
	}{
		{"400 ErrorResponse", 400, `{"code":"SANDBOX::INVALID_METADATA_LABEL","message":"bad key"}`, "SANDBOX::INVALID_METADATA_LABEL", "bad key", false, false},
		{"422 FastAPI detail without its input", 422,
			`{"detail":[{"type":"missing","loc":["body","env","TOKEN"],"msg":"Field required","input":"` + secret + `"}]}`,
			"", "body.env.TOKEN: Field required", false, false},
		{"422 whose message quotes the value", 422,
			`{"detail":[{"type":"value_error","loc":["body","env","TOKEN"],"msg":"Value error, ` + secret + ` is not allowed"}]}`,
			"", "body.env.TOKEN: Value error, [redacted] is not allowed", false, false},
		{"400 whose message quotes the value", 400, `{"code":"BAD","message":"env ` + secret + `"}`, "BAD", "env [redacted]", false, false},
		{"422 detail string", 422, `{"detail":"` + "bad" + `"}`, "", "bad", false, false},
		{"404", 404, `{"code":"SANDBOX::NOT_FOUND","message":"gone"}`, "SANDBOX::NOT_FOUND", "gone", true, false},
		{"409", 409, `{"code":"CONFLICT","message":"busy"}`, "CONFLICT", "busy", false, false},
		{"429 without body", 429, ``, "", "Too Many Requests", false, true},
		{"500 odd code type", 500, `{"code":5,"message":"boom"}`, "", "boom", false, true},
		{"502 proxy page", 502, `<html>` + secret + `</html>`, "", "Bad Gateway", false, true},
		{"503", 503, `{"code":"UNAVAILABLE","message":"later"}`, "UNAVAILABLE", "later", false, true},
		{"418 anything", 418, `{}`, "", "I'm a teapot", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			c, err := sandboxapi.New(sandboxapi.Options{BaseURL: srv.URL, Retry: sandboxapi.Retry{Attempts: 1}})
			if err != nil {
				t.Fatal(err)
			}
			req := imageRequest(nil)
			req.Env = map[string]string{"TOKEN": secret}
			_, err = c.Create(context.Background(), req)
			var apiErr *sandboxapi.APIError
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %v, want an *APIError", err)
			}
			if apiErr.Status != tt.status || apiErr.Code != tt.wantCode || apiErr.Message != tt.wantMessage {
				t.Fatalf("APIError = %+v, want status %d code %q message %q", apiErr, tt.status, tt.wantCode, tt.wantMessage)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error shows the request's environment: %v", err)
			}
			if sandboxapi.IsNotFound(err) != tt.notFound || sandboxapi.Retryable(err) != tt.retryable {
				t.Fatalf("IsNotFound = %v, Retryable = %v; want %v, %v", sandboxapi.IsNotFound(err), sandboxapi.Retryable(err), tt.notFound, tt.retryable)
			}
		})
	}
}

func TestRetryable(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"canceled", context.Canceled, false},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), false},
		{"transport", errors.New("connection reset by peer"), true},
		{"429", &sandboxapi.APIError{Status: 429}, true},
		{"504", &sandboxapi.APIError{Status: 504}, true},
		{"501", &sandboxapi.APIError{Status: 501}, false},
		{"400", &sandboxapi.APIError{Status: 400}, false},
	}
	for _, tt := range tests {
		if got := sandboxapi.Retryable(tt.err); got != tt.want {
			t.Errorf("%s: Retryable = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestValidateMetadata(t *testing.T) {
	tests := []struct {
		name    string
		md      map[string]string
		wantKey string // "" = valid
	}{
		{"labels", map[string]string{"ci.example.org/assignment-id": "linux-42", "name": "x", "a.b/c_d.e-f": "A-b_c.9"}, ""},
		{"empty value", map[string]string{"ci.example.org/image": ""}, ""},
		{"63 characters", map[string]string{"k": strings.Repeat("a", 63)}, ""},
		{"64 characters", map[string]string{"k": strings.Repeat("a", 64)}, "k"},
		{"slash in value", map[string]string{"ci.example.org/repository": "alice/repo"}, "ci.example.org/repository"},
		{"colon in value", map[string]string{"k": "spiffe:x"}, "k"},
		{"at in value", map[string]string{"k": "a@b"}, "k"},
		{"space in value", map[string]string{"k": "a b"}, "k"},
		{"value ends with dash", map[string]string{"k": "a-"}, "k"},
		{"reserved prefix", map[string]string{"opensandbox.io/pool": "x"}, "opensandbox.io/pool"},
		{"upper-case prefix", map[string]string{"CI.example.org/k": "x"}, "CI.example.org/k"},
		{"name too long", map[string]string{"p.io/" + strings.Repeat("n", 64): "x"}, "p.io/" + strings.Repeat("n", 64)},
		{"two slashes", map[string]string{"a/b/c": "x"}, "a/b/c"},
		{"empty key", map[string]string{"": "x"}, ""},
	}
	tests[len(tests)-1].wantKey = `""`
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := sandboxapi.ValidateMetadata(tt.md)
			if tt.wantKey == "" {
				if err != nil {
					t.Fatalf("ValidateMetadata: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("ValidateMetadata accepted what the server refuses")
			}
			if !strings.Contains(err.Error(), tt.wantKey) && !(tt.wantKey == `""` && strings.Contains(err.Error(), `""`)) {
				t.Fatalf("error %q does not name key %s", err, tt.wantKey)
			}
			for _, v := range tt.md {
				if len(v) > 3 && strings.Contains(err.Error(), v) {
					t.Fatalf("error %q quotes the value", err)
				}
			}
		})
	}
}

func TestMetadataFilter(t *testing.T) {
	got := sandboxapi.MetadataFilter(map[string]string{"ci.example.org/runner": "true", "ci.example.org/assignment-id": "linux-42"})
	want := "ci.example.org%2Fassignment-id=linux-42&ci.example.org%2Frunner=true"
	if got != want {
		t.Fatalf("MetadataFilter = %q, want %q", got, want)
	}
}

func TestListFiltersAndWalksEveryPage(t *testing.T) {
	fake := sandboxapitest.New(t)
	c := newClient(t, fake, "")
	ctx := context.Background()
	want := map[string]bool{}
	for i := range 25 {
		md := map[string]string{"ci.example.org/runner": "true", "ci.example.org/n": fmt.Sprint(i % 2)}
		sb, err := c.Create(ctx, imageRequest(md))
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			want[sb.ID] = true
		}
		if i == 3 {
			fake.SetState(sb.ID, "Paused") // the others are Running
		}
	}
	if _, err := c.Create(ctx, imageRequest(map[string]string{"other": "x"})); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		filter    sandboxapi.ListFilter
		wantCount int
		wantPages int
	}{
		{"everything in one page", sandboxapi.ListFilter{}, 26, 1},
		{"runner marker, pages of 7", sandboxapi.ListFilter{Metadata: map[string]string{"ci.example.org/runner": "true"}, PageSize: 7}, 25, 4},
		{"two pairs, pages of 5", sandboxapi.ListFilter{Metadata: map[string]string{"ci.example.org/runner": "true", "ci.example.org/n": "1"}, PageSize: 5}, 12, 3},
		{"page size divides exactly", sandboxapi.ListFilter{Metadata: map[string]string{"ci.example.org/runner": "true", "ci.example.org/n": "1"}, PageSize: 4}, 12, 3},
		{"states ORed", sandboxapi.ListFilter{States: []sandboxapi.State{sandboxapi.StateFailed, "paused"}}, 1, 1},
		{"state and metadata", sandboxapi.ListFilter{States: []sandboxapi.State{"running"}, Metadata: map[string]string{"ci.example.org/n": "1"}}, 11, 1},
		{"no match", sandboxapi.ListFilter{Metadata: map[string]string{"ci.example.org/n": "2"}}, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := fake.Calls("GET", "/sandboxes")
			got, err := c.List(ctx, tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.wantCount {
				t.Fatalf("List returned %d sandboxes, want %d", len(got), tt.wantCount)
			}
			if pages := fake.Calls("GET", "/sandboxes") - before; pages != tt.wantPages {
				t.Fatalf("List asked for %d pages, want %d", pages, tt.wantPages)
			}
			ids := map[string]bool{}
			for _, s := range got {
				if ids[s.ID] {
					t.Fatalf("sandbox %s listed twice", s.ID)
				}
				ids[s.ID] = true
				if v, ok := tt.filter.Metadata["ci.example.org/n"]; ok && s.Metadata["ci.example.org/n"] != v {
					t.Fatalf("sandbox %s does not match the filter: %v", s.ID, s.Metadata)
				}
			}
			if tt.name == "two pairs, pages of 5" {
				for id := range want {
					if !ids[id] {
						t.Fatalf("sandbox %s is missing", id)
					}
				}
			}
		})
	}
	for _, size := range []int{-1, sandboxapi.MaxPageSize + 1} {
		if _, err := c.List(ctx, sandboxapi.ListFilter{PageSize: size}); err == nil {
			t.Fatalf("List with page size %d was sent", size)
		}
	}
	if _, err := c.List(ctx, sandboxapi.ListFilter{Metadata: map[string]string{"k": "a/b"}}); err == nil {
		t.Fatal("a filter the server refuses was sent")
	}
	noRejections(t, fake)
}

func TestCreateGetPatchDelete(t *testing.T) {
	fake := sandboxapitest.New(t)
	c := newClient(t, fake, "")
	ctx := context.Background()
	created, err := c.Create(ctx, imageRequest(map[string]string{"ci.example.org/a": "1", "ci.example.org/b": "2"}))
	if err != nil {
		t.Fatal(err)
	}
	if created.ID == "" || created.State != sandboxapi.StateRunning || created.ExpiresAt.IsZero() {
		t.Fatalf("created = %+v", created)
	}
	three := "3"
	patched, err := c.PatchMetadata(ctx, created.ID, map[string]*string{"ci.example.org/a": nil, "ci.example.org/c": &three, "ci.example.org/missing": nil})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ci.example.org/b": "2", "ci.example.org/c": "3"}
	if fmt.Sprint(patched.Metadata) != fmt.Sprint(want) {
		t.Fatalf("patched metadata = %v, want %v", patched.Metadata, want)
	}
	got, err := c.Get(ctx, created.ID)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Metadata) != fmt.Sprint(want) || got.Image != "registry.example.org/runner:1" || !slices.Equal(got.Entrypoint, []string{"/runner"}) {
		t.Fatalf("got = %+v", got)
	}
	bad := "a/b"
	if _, err := c.PatchMetadata(ctx, created.ID, map[string]*string{"ci.example.org/c": &bad}); err == nil {
		t.Fatal("a patch the server refuses was sent")
	}
	if _, err := c.PatchMetadata(ctx, created.ID, map[string]*string{"opensandbox.io/x": nil}); err == nil {
		t.Fatal("a patch of a reserved key was sent")
	}
	for range 2 {
		if err := c.Delete(ctx, created.ID); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	}
	if _, err := c.Get(ctx, created.ID); !sandboxapi.IsNotFound(err) {
		t.Fatalf("Get after Delete: err = %v, want not found", err)
	}
	if _, err := c.PatchMetadata(ctx, created.ID, map[string]*string{"ci.example.org/c": &three}); !sandboxapi.IsNotFound(err) {
		t.Fatalf("PatchMetadata after Delete: err = %v, want not found", err)
	}
	noRejections(t, fake)
}

func TestCreateChecksBeforeSending(t *testing.T) {
	fake := sandboxapitest.New(t)
	c := newClient(t, fake, "")
	tests := []struct {
		name string
		edit func(*sandboxapi.CreateRequest)
		ok   bool
	}{
		{"image", func(*sandboxapi.CreateRequest) {}, true},
		{"pool alone", func(r *sandboxapi.CreateRequest) { *r = sandboxapi.CreateRequest{PoolRef: "warm"} }, true},
		{"no image, no pool", func(r *sandboxapi.CreateRequest) { r.Image = "" }, false},
		{"no entrypoint, no pool", func(r *sandboxapi.CreateRequest) { r.Entrypoint = nil }, false},
		{"no resource limits, no pool", func(r *sandboxapi.CreateRequest) { r.ResourceLimits = nil }, false},
		{"timeout under a minute", func(r *sandboxapi.CreateRequest) { r.Timeout = 59 * time.Second }, false},
		{"no timeout", func(r *sandboxapi.CreateRequest) { r.Timeout = 0 }, true},
		{"timeout rounded up", func(r *sandboxapi.CreateRequest) { r.Timeout = time.Minute + time.Millisecond }, true},
		{"metadata value with a slash", func(r *sandboxapi.CreateRequest) { r.Metadata = map[string]string{"k": "a/b"} }, false},
		{"reserved key", func(r *sandboxapi.CreateRequest) { r.Metadata = map[string]string{"opensandbox.io/k": "v"} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := imageRequest(nil)
			tt.edit(&req)
			before := fake.Calls("POST", "/sandboxes")
			_, err := c.Create(context.Background(), req)
			if (err == nil) != tt.ok {
				t.Fatalf("Create: err = %v, want ok %v", err, tt.ok)
			}
			if sent := fake.Calls("POST", "/sandboxes") - before; sent != map[bool]int{true: 1, false: 0}[tt.ok] {
				t.Fatalf("%d requests sent", sent)
			}
			if !tt.ok && sandboxapi.Retryable(err) {
				t.Fatalf("a refused request is retryable: %v", err)
			}
		})
	}
	if s := fake.Sandboxes(); len(s) != 4 || s[3].Timeout != 61 {
		t.Fatalf("sandboxes = %+v; want 4, the last with timeout 61 s", s)
	}
	noRejections(t, fake)
}

func TestRetriesIdempotentRequestsOnly(t *testing.T) {
	fake := sandboxapitest.New(t)
	c := newClient(t, fake, "")
	ctx := context.Background()
	sb, err := c.Create(ctx, imageRequest(nil))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		fault     sandboxapitest.Fault
		call      func() error
		path      string
		method    string
		wantCalls int
		wantErr   bool
	}{
		{"get after two 503", sandboxapitest.Fault{Status: 503, Times: 2},
			func() error { _, err := c.Get(ctx, sb.ID); return err }, "/sandboxes/{sandboxId}", "GET", 3, false},
		{"list after a 429 with Retry-After", sandboxapitest.Fault{Status: 429, RetryAfter: 1},
			func() error { _, err := c.List(ctx, sandboxapi.ListFilter{}); return err }, "/sandboxes", "GET", 2, false},
		{"patch after a 500", sandboxapitest.Fault{Status: 500},
			func() error { v := "x"; _, err := c.PatchMetadata(ctx, sb.ID, map[string]*string{"k": &v}); return err }, "/sandboxes/{sandboxId}/metadata", "PATCH", 2, false},
		{"get gives up after 4 attempts", sandboxapitest.Fault{Status: 502, Times: 4},
			func() error { _, err := c.Get(ctx, sb.ID); return err }, "/sandboxes/{sandboxId}", "GET", 4, true},
		{"create is sent once", sandboxapitest.Fault{Status: 503},
			func() error { _, err := c.Create(ctx, imageRequest(nil)); return err }, "/sandboxes", "POST", 1, true},
		{"create 429 is sent once", sandboxapitest.Fault{Status: 429},
			func() error { _, err := c.Create(ctx, imageRequest(nil)); return err }, "/sandboxes", "POST", 1, true},
		{"delete after a 504", sandboxapitest.Fault{Status: 504},
			func() error { return c.Delete(ctx, sb.ID) }, "/sandboxes/{sandboxId}", "DELETE", 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := fake.Calls(tt.method, tt.path)
			fake.Inject(tt.fault)
			start := time.Now()
			err := tt.call()
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil && !sandboxapi.Retryable(err) {
				t.Fatalf("err = %v is not retryable", err)
			}
			if n := fake.Calls(tt.method, tt.path) - before; n != tt.wantCalls {
				t.Fatalf("%d requests, want %d", n, tt.wantCalls)
			}
			if tt.fault.RetryAfter > 0 && time.Since(start) > time.Second {
				t.Fatalf("Retry-After was not capped by Retry.Max: took %s", time.Since(start))
			}
		})
	}
	if fake.Creates() != 1 {
		t.Fatalf("%d sandboxes created, want 1", fake.Creates())
	}
}

func TestRetryDelay(t *testing.T) {
	r := sandboxapi.Retry{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	tests := []struct {
		n          int
		retryAfter time.Duration
		lo, hi     time.Duration
	}{
		{1, 0, 0, 10 * time.Millisecond},
		{2, 0, 0, 20 * time.Millisecond},
		{5, 0, 0, 100 * time.Millisecond},
		{40, 0, 0, 100 * time.Millisecond},
		{1, 50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond},
		{1, time.Hour, 100 * time.Millisecond, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		for range 50 {
			if d := r.Delay(tt.n, tt.retryAfter); d < tt.lo || d > tt.hi {
				t.Fatalf("Delay(%d, %s) = %s, want within [%s, %s]", tt.n, tt.retryAfter, d, tt.lo, tt.hi)
			}
		}
	}
	if got := (sandboxapi.Retry{}).MaxAttempts(); got != 4 {
		t.Fatalf("default MaxAttempts = %d", got)
	}
}

func TestRetryStopsWithTheContext(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	c, err := sandboxapi.New(sandboxapi.Options{BaseURL: srv.URL, Retry: sandboxapi.Retry{Attempts: 100, Initial: time.Second, Max: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = c.Get(ctx, "sbx-1")
	if !errors.Is(err, context.DeadlineExceeded) || calls.Load() > 2 {
		t.Fatalf("err = %v after %d calls, want the context's deadline", err, calls.Load())
	}
}

func TestStates(t *testing.T) {
	tests := []struct {
		in       string
		want     sandboxapi.State
		terminal bool
	}{
		{"Terminated", sandboxapi.StateTerminated, true},
		{"failed", sandboxapi.StateFailed, true},
		{"Running", sandboxapi.StateRunning, false},
		{"PENDING", sandboxapi.StatePending, false},
		{"Allocated", sandboxapi.StateAllocated, false},
		{"Stopping", sandboxapi.StateStopping, false},
		{"Unknown", sandboxapi.StateUnknown, false},
		{"Hibernating", "Hibernating", false},
		{"", "", false},
	}
	for _, tt := range tests {
		got := sandboxapi.ParseState(tt.in)
		if got != tt.want || got.Terminal() != tt.terminal {
			t.Errorf("ParseState(%q) = %q (terminal %v), want %q (terminal %v)", tt.in, got, got.Terminal(), tt.want, tt.terminal)
		}
	}
}

func TestAnyRequestIDIsAccepted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-ID", "not-a-uuid")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"sbx-1","status":{"state":"Running"},"createdAt":"2026-01-02T03:04:05Z","entrypoint":["x"]}`))
	}))
	defer srv.Close()
	c, err := sandboxapi.New(sandboxapi.Options{BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.Get(context.Background(), "sbx-1")
	if err != nil || sb.State != sandboxapi.StateRunning || sb.Metadata == nil {
		t.Fatalf("Get = %+v, %v", sb, err)
	}
}
