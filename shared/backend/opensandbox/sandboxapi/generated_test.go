package sandboxapi

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/internal/lifecycleapi"
)

// The real server echoes any X-Request-ID. Without spec/overlay.yml the
// generated parsers read it as a UUID and fail the whole call.
func TestGeneratedParsersAcceptAnyRequestID(t *testing.T) {
	resp := &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"req-from-a-proxy"}},
		Body:       io.NopCloser(strings.NewReader(`{"id":"sbx-1","status":{"state":"Running"},"createdAt":"2026-01-02T03:04:05Z","entrypoint":["x"]}`)),
	}
	parsed, err := lifecycleapi.ParseGetSandboxesSandboxIdResponse(resp)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if parsed.Headers200 == nil || parsed.Headers200.XRequestID == nil || *parsed.Headers200.XRequestID != "req-from-a-proxy" {
		t.Fatalf("X-Request-ID = %+v", parsed.Headers200)
	}
}
