package sandboxapitest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/spec"
)

func TestSpecificationIsValid(t *testing.T) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(spec.LifecycleYAML())
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("the lifecycle specification is not a valid OpenAPI document: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("OpenAPI %s: the validator would not apply JSON Schema 2020-12", doc.OpenAPI)
	}
}

// The response check must catch what the specification forbids, or the
// fake could drift from the contract unnoticed.
func TestValidateResponseCatchesBrokenAnswers(t *testing.T) {
	c, err := newContract("http://127.0.0.1:1", "")
	if err != nil {
		t.Fatal(err)
	}
	ok := `{"id":"sbx-1","status":{"state":"Running"},"createdAt":"2026-01-02T03:04:05Z","entrypoint":["x"],"metadata":{"a":"b"}}`
	tests := []struct {
		name    string
		method  string
		path    string
		status  int
		body    string
		wantErr bool
	}{
		{"a sandbox", "GET", "/v1/sandboxes/sbx-1", 200, ok, false},
		{"no entrypoint", "GET", "/v1/sandboxes/sbx-1", 200, `{"id":"sbx-1","status":{"state":"Running"},"createdAt":"2026-01-02T03:04:05Z"}`, true},
		{"no status", "GET", "/v1/sandboxes/sbx-1", 200, `{"id":"sbx-1","createdAt":"2026-01-02T03:04:05Z","entrypoint":["x"]}`, true},
		{"metadata value not a string", "GET", "/v1/sandboxes/sbx-1", 200, `{"id":"sbx-1","status":{"state":"Running"},"createdAt":"2026-01-02T03:04:05Z","entrypoint":["x"],"metadata":{"a":1}}`, true},
		{"createdAt not a date-time", "GET", "/v1/sandboxes/sbx-1", 200, `{"id":"sbx-1","status":{"state":"Running"},"createdAt":"yesterday","entrypoint":["x"]}`, true},
		{"ErrorResponse with an extra field", "GET", "/v1/sandboxes/sbx-1", 404, `{"code":"x","message":"y","detail":"z"}`, true},
		{"ErrorResponse", "GET", "/v1/sandboxes/sbx-1", 404, `{"code":"x","message":"y"}`, false},
		{"undeclared 400 on get", "GET", "/v1/sandboxes/sbx-1", 400, `{"code":"x","message":"y"}`, true},
		{"create answered 200", "POST", "/v1/sandboxes", 200, ok, true},
		{"create answered 202", "POST", "/v1/sandboxes", 202, ok, false},
		{"page without pagination", "GET", "/v1/sandboxes", 200, `{"items":[]}`, true},
		{"delete with 200", "DELETE", "/v1/sandboxes/sbx-1", 200, ``, true},
		{"422 FastAPI", "POST", "/v1/sandboxes", 422, `{"detail":[{"type":"missing","loc":["body"],"msg":"m"}]}`, false},
		{"422 ErrorResponse", "POST", "/v1/sandboxes", 422, `{"code":"x","message":"y"}`, true},
		{"429 without code", "GET", "/v1/sandboxes", 429, `{"message":"y"}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"image":{"uri":"x"},"entrypoint":["x"],"resourceLimits":{"cpu":"1"}}`
			if tt.method != "POST" {
				body = ""
			}
			var r *http.Request
			if body != "" {
				r = httptest.NewRequest(tt.method, "http://127.0.0.1:1"+tt.path, strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
			} else {
				r = httptest.NewRequest(tt.method, "http://127.0.0.1:1"+tt.path, nil)
			}
			in, err := c.validateRequest(context.Background(), r)
			if err != nil {
				t.Fatalf("request: %v", err)
			}
			h := http.Header{"X-Request-Id": {"3f2b6c1e-8d4a-4c2b-9e1f-0a1b2c3d4e5f"}}
			if tt.body != "" {
				h.Set("Content-Type", "application/json")
			}
			err = c.validateResponse(context.Background(), in, tt.status, h, []byte(tt.body))
			if (err != nil) != tt.wantErr {
				t.Fatalf("validateResponse: err = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}
