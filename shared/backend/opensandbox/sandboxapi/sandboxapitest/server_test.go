package sandboxapitest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
)

// do sends a raw request, bypassing the client and its own checks, and
// returns the status and body of the answer.
func do(t *testing.T, fake *sandboxapitest.Server, method, path, body string, header ...string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, fake.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
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
	return resp.StatusCode, string(b)
}

const image = `"image":{"uri":"runner:1"},"entrypoint":["/runner"],"resourceLimits":{"cpu":"1"}`

func create(t *testing.T, fake *sandboxapitest.Server, fields string) string {
	t.Helper()
	status, body := do(t, fake, "POST", "/v1/sandboxes", "{"+fields+"}")
	if status != http.StatusAccepted {
		t.Fatalf("create {%s}: %d %s", fields, status, body)
	}
	var v struct{ ID string }
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.ID == "" {
		t.Fatalf("create answer %s: %v", body, err)
	}
	return v.ID
}

// The fake must refuse whatever the real server refuses, or it would hide
// client bugs.
func TestRefusesWhatTheServerRefuses(t *testing.T) {
	fake := sandboxapitest.New(t, sandboxapitest.WithAPIKey("key"))
	auth := []string{"OPEN-SANDBOX-API-KEY", "key"}
	id := fake.Seed([]byte("{" + image + "}"))
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		header     []string
		wantStatus int
		wantCode   string
	}{
		{"value with a slash", "POST", "/v1/sandboxes", `{` + image + `,"metadata":{"ci.example.org/repository":"alice/repo"}}`, auth, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{"value with a colon", "POST", "/v1/sandboxes", `{` + image + `,"metadata":{"k":"spiffe:x"}}`, auth, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{"64-character value", "POST", "/v1/sandboxes", `{` + image + `,"metadata":{"k":"` + strings.Repeat("a", 64) + `"}}`, auth, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{"reserved key", "POST", "/v1/sandboxes", `{` + image + `,"metadata":{"opensandbox.io/pool":"x"}}`, auth, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{"upper-case key prefix", "POST", "/v1/sandboxes", `{` + image + `,"metadata":{"CI.org/k":"x"}}`, auth, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{"64-character key name", "POST", "/v1/sandboxes", `{` + image + `,"metadata":{"` + strings.Repeat("n", 64) + `":"x"}}`, auth, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{"no image, no pool", "POST", "/v1/sandboxes", `{"entrypoint":["/runner"],"resourceLimits":{"cpu":"1"}}`, auth, 422, ""},
		{"image without entrypoint", "POST", "/v1/sandboxes", `{"image":{"uri":"runner:1"},"resourceLimits":{"cpu":"1"}}`, auth, 422, ""},
		{"image without resource limits", "POST", "/v1/sandboxes", `{"image":{"uri":"runner:1"},"entrypoint":["/runner"]}`, auth, 422, ""},
		{"image and snapshot", "POST", "/v1/sandboxes", `{` + image + `,"snapshotId":"snap-1"}`, auth, 422, ""},
		{"pool and snapshot", "POST", "/v1/sandboxes", `{"snapshotId":"snap-1","extensions":{"poolRef":"warm"}}`, auth, 422, ""},
		{"timeout under a minute (spec)", "POST", "/v1/sandboxes", `{` + image + `,"timeout":59}`, auth, 422, ""},
		{"entrypoint not a list (spec)", "POST", "/v1/sandboxes", `{"image":{"uri":"x"},"entrypoint":"/runner","resourceLimits":{"cpu":"1"}}`, auth, 422, ""},
		{"empty entrypoint (spec)", "POST", "/v1/sandboxes", `{"image":{"uri":"x"},"entrypoint":[],"resourceLimits":{"cpu":"1"}}`, auth, 422, ""},
		{"env value not a string (spec)", "POST", "/v1/sandboxes", `{` + image + `,"env":{"A":1}}`, auth, 422, ""},
		{"image without uri (spec)", "POST", "/v1/sandboxes", `{"image":{},"entrypoint":["x"],"resourceLimits":{"cpu":"1"}}`, auth, 422, ""},
		{"not JSON (spec)", "POST", "/v1/sandboxes", `{`, auth, 422, ""},
		{"no API key", "GET", "/v1/sandboxes", "", nil, 401, "MISSING_API_KEY"},
		{"wrong API key", "GET", "/v1/sandboxes", "", []string{"OPEN-SANDBOX-API-KEY", "other"}, 401, "INVALID_API_KEY"},
		{"no API key, invalid body", "POST", "/v1/sandboxes", `{`, nil, 401, "MISSING_API_KEY"},
		{"no API key, unknown route", "GET", "/v1/things", "", nil, 401, "MISSING_API_KEY"},
		{"timeout above the maximum", "POST", "/v1/sandboxes", `{` + image + `,"timeout":86401}`, auth, 400, "SANDBOX::INVALID_PARAMETER"},
		{"pageSize 201", "GET", "/v1/sandboxes?pageSize=201", "", auth, 422, ""},
		{"pageSize 0 (spec)", "GET", "/v1/sandboxes?pageSize=0", "", auth, 422, ""},
		{"page 0 (spec)", "GET", "/v1/sandboxes?page=0", "", auth, 422, ""},
		{"page not a number (spec)", "GET", "/v1/sandboxes?page=x", "", auth, 422, ""},
		{"patch reserved key", "PATCH", "/v1/sandboxes/" + id + "/metadata", `{"opensandbox.io/x":"y"}`, auth, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{"patch deleting a reserved key", "PATCH", "/v1/sandboxes/" + id + "/metadata", `{"opensandbox.io/x":null}`, auth, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{"patch value with a slash", "PATCH", "/v1/sandboxes/" + id + "/metadata", `{"k":"a/b"}`, auth, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{"patch value a number (spec)", "PATCH", "/v1/sandboxes/" + id + "/metadata", `{"k":5}`, auth, 422, ""},
		{"no /v1 base path", "GET", "/sandboxes", "", auth, 404, ""},
		{"unknown route", "GET", "/v1/things", "", auth, 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := fake.Creates()
			status, body := do(t, fake, tt.method, tt.path, tt.body, tt.header...)
			if status != tt.wantStatus {
				t.Fatalf("%s %s: %d %s, want %d", tt.method, tt.path, status, body, tt.wantStatus)
			}
			if tt.wantCode != "" {
				var e struct{ Code, Message string }
				if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != tt.wantCode || e.Message == "" {
					t.Fatalf("body %s, want code %s", body, tt.wantCode)
				}
			}
			if status == 422 {
				var e struct {
					Detail []struct {
						Loc []any
						Msg string
					}
				}
				if err := json.Unmarshal([]byte(body), &e); err != nil || len(e.Detail) == 0 || e.Detail[0].Msg == "" {
					t.Fatalf("422 body %s is not FastAPI's", body)
				}
			}
			if fake.Creates() != before {
				t.Fatal("a refused create took effect")
			}
			rej := fake.Rejections()
			if len(rej) == 0 || rej[len(rej)-1].Status != tt.wantStatus {
				t.Fatalf("rejections = %+v", rej)
			}
		})
	}
	if s, ok := fake.Sandbox(id); !ok || len(s.Metadata) != 0 {
		t.Fatalf("a refused patch took effect: %+v", s)
	}
}

func TestLifecycle(t *testing.T) {
	fake := sandboxapitest.New(t)
	status, body := do(t, fake, "POST", "/v1/sandboxes", `{`+image+`,"timeout":3600,"env":{"TOKEN":"t"},"metadata":{"ci.example.org/a":"1"}}`)
	if status != http.StatusAccepted {
		t.Fatalf("create: %d %s", status, body)
	}
	var created struct {
		ID       string
		Status   struct{ State string }
		Metadata map[string]string
	}
	if err := json.Unmarshal([]byte(body), &created); err != nil || created.Status.State != "Running" || created.Metadata["ci.example.org/a"] != "1" {
		t.Fatalf("created %s: %v", body, err)
	}
	id := created.ID
	if s, _ := fake.Sandbox(id); s.Env["TOKEN"] != "t" || s.Timeout != 3600 || s.Image != "runner:1" {
		t.Fatalf("sandbox = %+v", s)
	}
	if strings.Contains(body, `"TOKEN"`) {
		t.Fatal("the environment is echoed")
	}
	pool := create(t, fake, `"extensions":{"poolRef":"warm"}`)
	if s, _ := fake.Sandbox(pool); s.PoolRef != "warm" || len(s.Entrypoint) == 0 {
		t.Fatalf("pool sandbox = %+v", s)
	}

	fake.SetState(id, "Running")
	status, body = do(t, fake, "GET", "/v1/sandboxes/"+id, "")
	if status != 200 || !strings.Contains(body, `"state":"Running"`) || !strings.Contains(body, `"uri":"runner:1"`) {
		t.Fatalf("get: %d %s", status, body)
	}
	status, body = do(t, fake, "PATCH", "/v1/sandboxes/"+id+"/metadata", `{"ci.example.org/a":null,"ci.example.org/b":"2","ci.example.org/never":null}`)
	if status != 200 || !strings.Contains(body, `"metadata":{"ci.example.org/b":"2"}`) {
		t.Fatalf("patch: %d %s", status, body)
	}
	if status, body = do(t, fake, "PATCH", "/v1/sandboxes/"+id+"/metadata", `{}`); status != 200 || !strings.Contains(body, `"ci.example.org/b":"2"`) {
		t.Fatalf("empty patch: %d %s", status, body)
	}
	if status, body = do(t, fake, "DELETE", "/v1/sandboxes/"+id, ""); status != http.StatusNoContent || body != "" {
		t.Fatalf("delete: %d %s", status, body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if status, body = do(t, fake, m, "/v1/sandboxes/"+id, ""); status != http.StatusNotFound || body != `{"code":"DOCKER::SANDBOX_NOT_FOUND","message":"Sandbox `+id+` not found."}` {
			t.Fatalf("%s after delete: %d %s", m, status, body)
		}
	}
	if status, _ = do(t, fake, "PATCH", "/v1/sandboxes/"+id+"/metadata", `{}`); status != http.StatusNotFound {
		t.Fatalf("patch after delete: %d", status)
	}
	if fake.Creates() != 2 || len(fake.Sandboxes()) != 1 {
		t.Fatalf("creates %d, sandboxes %+v", fake.Creates(), fake.Sandboxes())
	}
	if r := fake.Rejections(); len(r) != 0 {
		t.Fatalf("a 404 of a missing sandbox is an answer, not a refusal: %+v", r)
	}
}

func TestListFilters(t *testing.T) {
	fake := sandboxapitest.New(t)
	var ids []string
	for i := range 7 {
		ids = append(ids, create(t, fake, fmt.Sprintf(`%s,"metadata":{"ci.example.org/n":"%d","ci.example.org/even":"%v"}`, image, i, i%2 == 0)))
	}
	fake.SetState(ids[1], "Failed") // the others are Running
	fake.SetState(ids[2], "Paused")
	type page struct {
		Items []struct {
			ID string
		}
		Pagination struct {
			Page, PageSize, TotalItems, TotalPages int
			HasNextPage                            bool
		}
	}
	filter := func(m string) string { return "metadata=" + url.QueryEscape(m) }
	tests := []struct {
		name      string
		query     string
		wantIDs   []string
		wantTotal int
		wantNext  bool
	}{
		{"default page", "", ids, 7, false},
		{"page 2 of 3", "page=2&pageSize=3", ids[3:6], 7, true},
		{"last page", "page=3&pageSize=3", ids[6:], 7, false},
		{"beyond the last page", "page=9&pageSize=3", nil, 7, false},
		{"one pair", filter("ci.example.org/even=true"), []string{ids[0], ids[2], ids[4], ids[6]}, 4, false},
		{"two pairs", filter("ci.example.org/even=true&ci.example.org/n=4"), []string{ids[4]}, 1, false},
		{"pairs must all match", filter("ci.example.org/even=false&ci.example.org/n=4"), nil, 0, false},
		{"missing key", filter("ci.example.org/other=x"), nil, 0, false},
		{"states are ORed, any case", "state=failed&state=PAUSED", ids[1:3], 2, false},
		{"state and metadata", "state=Running&" + filter("ci.example.org/even=true"), []string{ids[0], ids[4], ids[6]}, 3, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := do(t, fake, "GET", "/v1/sandboxes?"+tt.query, "")
			if status != 200 {
				t.Fatalf("%d %s", status, body)
			}
			var p page
			if err := json.Unmarshal([]byte(body), &p); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, it := range p.Items {
				got = append(got, it.ID)
			}
			if !slices.Equal(got, tt.wantIDs) || p.Pagination.TotalItems != tt.wantTotal || p.Pagination.HasNextPage != tt.wantNext {
				t.Fatalf("items %v total %d next %v; want %v total %d next %v", got, p.Pagination.TotalItems, p.Pagination.HasNextPage, tt.wantIDs, tt.wantTotal, tt.wantNext)
			}
		})
	}
}

func TestFaults(t *testing.T) {
	fake := sandboxapitest.New(t)
	id := create(t, fake, image)

	fake.FailNext(2, http.StatusServiceUnavailable)
	for range 2 {
		if status, body := do(t, fake, "GET", "/v1/sandboxes/"+id, ""); status != 503 || !strings.Contains(body, `"code"`) {
			t.Fatalf("faulted get: %d %s", status, body)
		}
	}
	if status, _ := do(t, fake, "GET", "/v1/sandboxes/"+id, ""); status != 200 {
		t.Fatalf("get after the faults: %d", status)
	}

	// A fault for POST leaves other methods alone; without AfterEffect the
	// create does not happen.
	fake.Inject(sandboxapitest.Fault{Method: "POST", Status: http.StatusTooManyRequests, RetryAfter: 3})
	if status, _ := do(t, fake, "GET", "/v1/sandboxes", ""); status != 200 {
		t.Fatalf("list: %d", status)
	}
	before := fake.Creates()
	req, _ := http.NewRequest("POST", fake.URL+"/v1/sandboxes", strings.NewReader("{"+image+"}"))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" || fake.Creates() != before {
		t.Fatalf("faulted create: %d, Retry-After %q, creates %d", resp.StatusCode, resp.Header.Get("Retry-After"), fake.Creates()-before)
	}

	// AfterEffect: the create happens, its answer is lost.
	fake.Inject(sandboxapitest.Fault{Method: "POST", Status: http.StatusInternalServerError, AfterEffect: true})
	if status, _ := do(t, fake, "POST", "/v1/sandboxes", "{"+image+"}"); status != 500 {
		t.Fatalf("faulted create: %d", status)
	}
	if fake.Creates() != before+1 || len(fake.Sandboxes()) != 2 {
		t.Fatalf("the create did not take effect: creates %d", fake.Creates()-before)
	}

	fake.SetLatency(60 * time.Millisecond)
	start := time.Now()
	do(t, fake, "GET", "/v1/sandboxes/"+id, "")
	if d := time.Since(start); d < 60*time.Millisecond {
		t.Fatalf("latency not applied: %s", d)
	}
	if calls := fake.Calls("GET", "/v1/sandboxes/{sandboxId}"); calls != 0 {
		t.Fatalf("Calls takes the specification's path, got %d for a URL", calls)
	}
	if calls := fake.Calls("GET", "/sandboxes/{sandboxId}"); calls != 4 {
		t.Fatalf("Calls = %d, want 4", calls)
	}
}

func TestEchoesTheRequestID(t *testing.T) {
	fake := sandboxapitest.New(t)
	for _, sent := range []string{"", "3f2b6c1e-8d4a-4c2b-9e1f-0a1b2c3d4e5f"} {
		req, _ := http.NewRequest("GET", fake.URL+"/v1/sandboxes", nil)
		if sent != "" {
			req.Header.Set("X-Request-ID", sent)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := resp.Header.Get("X-Request-ID")
		if (sent != "" && got != sent) || len(got) != 36 {
			t.Fatalf("sent %q, got X-Request-ID %q", sent, got)
		}
	}
}

func TestSeedAppliesTheServerRules(t *testing.T) {
	fake := sandboxapitest.New(t)
	id := fake.Seed([]byte(`{"extensions":{"poolRef":"warm"},"metadata":{"ci.example.org/a":"1"}}`))
	if s, ok := fake.Sandbox(id); !ok || s.Metadata["ci.example.org/a"] != "1" {
		t.Fatalf("seeded = %+v", s)
	}
	rec := &recordingTB{TB: t}
	other := sandboxapitest.New(rec)
	func() {
		defer func() { _ = recover() }() // FailNow of the recorder
		other.Seed([]byte(`{"extensions":{"poolRef":"warm"},"metadata":{"k":"a/b"}}`))
	}()
	if !rec.failed {
		t.Fatal("Seed accepted metadata the server refuses")
	}
}
