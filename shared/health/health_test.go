package health

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestProbes(t *testing.T) {
	failing := errors.New("nats://user:secret@nats:4222 unreachable")
	ok := func(context.Context) error { return nil }
	bad := func(context.Context) error { return failing }
	for _, tc := range []struct {
		name     string
		checks   []Check
		path     string
		wantCode int
		wantBody string
	}{
		{"no checks", nil, "/healthz", http.StatusOK, "ok\n"},
		{"all ready", []Check{{"nats", ok}, {"svid", ok}}, "/healthz", http.StatusOK, "ok\n"},
		{"one fails", []Check{{"nats", bad}, {"svid", ok}}, "/healthz", http.StatusServiceUnavailable, "not ready: nats\n"},
		{"both fail", []Check{{"nats", bad}, {"svid", bad}}, "/healthz", http.StatusServiceUnavailable, "not ready: nats, svid\n"},
		{"liveness never looks", []Check{{"nats", bad}}, "/livez", http.StatusOK, "alive\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			Probes{Checks: tc.checks}.Register(mux)
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
			body, _ := io.ReadAll(rec.Body)
			if rec.Code != tc.wantCode || string(body) != tc.wantBody {
				t.Fatalf("GET %s = %d %q, want %d %q", tc.path, rec.Code, body, tc.wantCode, tc.wantBody)
			}
			if strings.Contains(string(body), "secret") {
				t.Fatalf("the answer shows a check's error: %q", body)
			}
		})
	}
}
