package sandboxapi

import (
	"strings"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/internal/lifecycleapi"
)

// State is a sandbox's lifecycle state. The set is open: the server may
// answer states this package has no constant for.
type State string

// The states the server is known to answer.
const (
	StatePending    State = "Pending"
	StateAllocated  State = "Allocated"
	StateRunning    State = "Running"
	StatePausing    State = "Pausing"
	StatePaused     State = "Paused"
	StateResuming   State = "Resuming"
	StateStopping   State = "Stopping"
	StateTerminated State = "Terminated"
	StateFailed     State = "Failed"
	StateUnknown    State = "Unknown"
)

var knownStates = []State{
	StatePending, StateAllocated, StateRunning, StatePausing, StatePaused,
	StateResuming, StateStopping, StateTerminated, StateFailed, StateUnknown,
}

// ParseState returns the state named s: a known state whatever its case
// (the server compares states case-insensitively), else s as it is.
func ParseState(s string) State {
	for _, k := range knownStates {
		if strings.EqualFold(s, string(k)) {
			return k
		}
	}
	return State(s)
}

// Terminal reports whether a sandbox in state s has finished for good:
// Terminated (its entry process exited 0, or it expired) or Failed. Any
// other state, including one this package does not know, is not terminal.
func (s State) Terminal() bool { return s == StateTerminated || s == StateFailed }

// Sandbox is what the server tells about one sandbox.
type Sandbox struct {
	ID    string
	State State
	// Reason and Message detail the state, as the server words them.
	Reason  string
	Message string
	// Metadata is never nil. It may hold keys nobody of this project set:
	// trust only keys under the project's own prefix.
	Metadata map[string]string
	// Entrypoint is the sandbox's entry process.
	Entrypoint []string
	// Image is the image URI; empty in a create answer and for sandboxes
	// that were not created from an image.
	Image     string
	CreatedAt time.Time
	// ExpiresAt is when the server terminates the sandbox; zero when never.
	ExpiresAt time.Time
}

// CreateRequest describes a sandbox to create. Either PoolRef is set, or
// Image, Entrypoint and ResourceLimits all are.
type CreateRequest struct {
	// PoolRef creates the sandbox from a pre-warmed pool (the
	// extensions.poolRef extension); the pool then defines the image,
	// entrypoint and resources left empty.
	PoolRef        string
	Image          string
	Entrypoint     []string
	ResourceLimits map[string]string
	// Timeout is how long the sandbox may live before the server terminates
	// it, rounded up to whole seconds; at least one minute. Zero means no
	// automatic expiry.
	Timeout time.Duration
	// Env is the sandbox's environment. It may hold credentials: it goes to
	// the server only, never into an error.
	Env map[string]string
	// Metadata is checked with ValidateMetadata before anything is sent.
	Metadata map[string]string
}

// ListFilter selects sandboxes. Empty fields select everything.
type ListFilter struct {
	// States are ORed.
	States []State
	// Metadata selects sandboxes whose metadata holds every pair, exactly.
	Metadata map[string]string
	// PageSize is the number of sandboxes asked for per request, at most
	// MaxPageSize; zero means MaxPageSize.
	PageSize int
}

// MaxPageSize is the largest page the server serves.
const MaxPageSize = 200

func fromSandbox(s lifecycleapi.Sandbox) Sandbox {
	out := Sandbox{
		ID:         s.Id,
		State:      ParseState(s.Status.State),
		Reason:     deref(s.Status.Reason),
		Message:    deref(s.Status.Message),
		Metadata:   map[string]string{},
		Entrypoint: s.Entrypoint,
		CreatedAt:  s.CreatedAt,
	}
	if s.Metadata != nil {
		for k, v := range *s.Metadata {
			out.Metadata[k] = v
		}
	}
	if s.Image != nil {
		out.Image = s.Image.Uri
	}
	if s.ExpiresAt != nil {
		out.ExpiresAt = *s.ExpiresAt
	}
	return out
}

func fromCreated(s lifecycleapi.CreateSandboxResponse) Sandbox {
	return fromSandbox(lifecycleapi.Sandbox{
		Id: s.Id, Status: s.Status, Metadata: s.Metadata, Entrypoint: s.Entrypoint,
		CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt,
	})
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
