package opensandbox_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// refusingCreates is the fake server's client whose creates all fail with err.
type refusingCreates struct {
	*sandboxapi.Client
	err error
}

func (r refusingCreates) Create(context.Context, sandboxapi.CreateRequest) (sandboxapi.Sandbox, error) {
	return sandboxapi.Sandbox{}, r.err
}

// TestCreateErrorClasses: a create the server will refuse every time is
// permanent (the task is failed at once); one that time or an operator can
// fix stays transient.
func TestCreateErrorClasses(t *testing.T) {
	apiErr := func(status int) error {
		return &sandboxapi.APIError{Status: status, Code: "SANDBOX::X", Message: http.StatusText(status)}
	}
	tests := []struct {
		name      string
		pool      string
		backend   taskassignment.BackendKind
		createErr error
		permanent bool
	}{
		{"bad request", "linux", "", apiErr(http.StatusBadRequest), true},
		{"unprocessable (image that cannot be used)", "linux", "", apiErr(http.StatusUnprocessableEntity), true},
		{"not found (pool ref)", "linux", "", apiErr(http.StatusNotFound), true},
		{"pool of another backend", "pods", "", nil, true},
		{"unknown pool", "gpu", "", nil, true},
		{"assignment of another backend", "linux", taskassignment.BackendPod, nil, true},
		{"unauthorized (API key)", "linux", "", apiErr(http.StatusUnauthorized), false},
		{"forbidden", "linux", "", apiErr(http.StatusForbidden), false},
		{"request timeout", "linux", "", apiErr(http.StatusRequestTimeout), false},
		{"conflict", "linux", "", apiErr(http.StatusConflict), false},
		{"throttled", "linux", "", apiErr(http.StatusTooManyRequests), false},
		{"server error", "linux", "", apiErr(http.StatusInternalServerError), false},
		{"transport", "linux", "", errors.New("connection refused"), false},
		{"cancelled", "linux", "", context.Canceled, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(c *opensandbox.Config) {
				c.Sandboxes = refusingCreates{Client: c.Sandboxes.(*sandboxapi.Client), err: tt.createErr}
			})
			a := assignment(t, tt.pool, 42)
			spec := h.launch(t, a)
			if tt.backend != "" {
				a.Backend = tt.backend
			}
			_, err := h.backend.Create(context.Background(), a, spec)
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if got := executor.IsPermanent(err); got != tt.permanent {
				t.Fatalf("IsPermanent(%v) = %v, want %v", err, got, tt.permanent)
			}
		})
	}
}
