// Package opensandbox runs assignments in OpenSandbox sandboxes: it
// implements executor.Backend over the
// OpenSandbox lifecycle API (shared/backend/opensandbox/sandboxapi).
//
// Everything recovery needs lives in the sandbox's metadata: the labels of
// taskassignment.Keys as they are, and the annotations encoded into label
// values (EncodeAnnotations). A sandbox is found by its assignment-id label;
// its ID is both the executor's name and its identity target. No SPIRE agent
// can attest a sandbox: BindIdentity verifies the SPIFFE ID persisted in the
// sandbox's metadata, and a configured Minter gives the sandbox a
// short-lived X.509-SVID in its environment when it is created.
package opensandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// Sandboxes is the part of the OpenSandbox lifecycle API the backend uses;
// *sandboxapi.Client implements it. Delete of a missing sandbox succeeds,
// List returns every page, and Get of a missing sandbox is an error for which
// sandboxapi.IsNotFound is true.
type Sandboxes interface {
	Create(ctx context.Context, r sandboxapi.CreateRequest) (sandboxapi.Sandbox, error)
	Get(ctx context.Context, id string) (sandboxapi.Sandbox, error)
	List(ctx context.Context, f sandboxapi.ListFilter) ([]sandboxapi.Sandbox, error)
	PatchMetadata(ctx context.Context, id string, patch map[string]*string) (sandboxapi.Sandbox, error)
	Delete(ctx context.Context, id string) error
}

// Config configures a Backend.
type Config struct {
	Sandboxes Sandboxes
	// Keys are the metadata keys; their common prefix also carries the
	// annotation chunks (<prefix>/annotations-NNN) and the terminal marker
	// (<prefix>/terminal).
	Keys taskassignment.Keys
	// TrustDomain is the trust domain of every identity the backend binds
	// and recovers.
	TrustDomain spiffeid.TrustDomain
	// Pools are the runner pools; those of backend opensandbox must have a
	// valid Profile. A sandbox lives at most its pool's job timeout, and at
	// least a minute (the API's minimum).
	Pools runnerpool.Pools
	// MaxTimeout is the server's max_sandbox_timeout_seconds: a pool whose
	// job timeout is longer gets sandboxes of MaxTimeout instead (logged
	// once, by New), since the server refuses a longer timeout with 400.
	// Zero is DefaultMaxTimeout, the server's own default.
	MaxTimeout time.Duration
	// Log, if set, hears of configuration New adjusted (a clamped timeout).
	Log *slog.Logger
	// Minter, if set, mints the X.509-SVID each new sandbox gets in its
	// environment (see bootstrap.SVIDEnvironment), for the pool's job
	// timeout: spiremint (a SPIRE Server) or svidca (the local CA). Its
	// errors are transient.
	Minter bootstrap.Minter
	// CreateRetry bounds the creates of one sandbox after a failure that may
	// or may not have taken effect (429, 5xx, no answer). Before each retry
	// the backend looks the sandbox up by its assignment ID, so a create that
	// did take effect is never repeated. The zero value is the default
	// policy of sandboxapi.Retry.
	CreateRetry sandboxapi.Retry
	// OnEvent, if set, is told what the backend did on its own (see
	// EventName). It is called synchronously and must not block.
	OnEvent func(Event)
	// OnCorrupt, if set, is told of every sandbox of this installation that
	// RecoverAssignments skips because its metadata does not rebuild an
	// assignment. err names the sandbox's fault, never a credential.
	OnCorrupt func(sandboxID string, err error)
}

// Event is something the backend did or skipped on its own. It carries IDs
// and an error from the API or the metadata, never an environment value.
type Event struct {
	Name         EventName
	SandboxID    string
	AssignmentID string
	Err          error
}

// EventName names an Event.
type EventName string

const (
	// EventCreateRetried: a create failed in a way that may or may not have
	// taken effect, no sandbox of the assignment exists, so it is retried.
	EventCreateRetried EventName = "sandbox_create_retried"
	// EventDuplicateDeleted: a create raced another for the same
	// assignment and lost (its sandbox is younger); it deleted its own
	// sandbox (Err set if that failed) and adopted the older one.
	EventDuplicateDeleted EventName = "sandbox_duplicate_deleted"
	// EventSkippedDuplicate: recovery found a younger second sandbox of an
	// assignment and left it out; it is handled once the older one is gone.
	EventSkippedDuplicate EventName = "sandbox_skipped_duplicate"
	// EventSkippedTerminal: recovery found a sandbox carrying the terminal
	// marker, left it out and finished deleting it (Err set if that
	// failed; the next recovery tries again).
	EventSkippedTerminal EventName = "sandbox_skipped_terminal"
	// EventCreateAdopted: a create failed in a way that may have taken
	// effect (Err: a lost answer; a 504 KUBERNETES::POD_READY_TIMEOUT from a
	// Kubernetes runtime whose Pod was not ready within the server's wait,
	// when its cleanup left the sandbox), and the assignment's sandbox
	// exists: it is adopted, never created twice.
	EventCreateAdopted EventName = "sandbox_create_adopted"
)

// DefaultMaxTimeout is the OpenSandbox server's default
// max_sandbox_timeout_seconds (86400).
const DefaultMaxTimeout = 24 * time.Hour

// Backend is the OpenSandbox backend. It holds no state of its own: every
// method reads the server again, and every method is idempotent.
type Backend struct {
	cfg         Config
	prefix      string
	terminalKey string
	pools       map[string]pool
}

type pool struct {
	profile Profile
	timeout time.Duration
	// of is the runner pool itself (its images rule).
	of runnerpool.Pool
}

// New checks cfg and returns its Backend: the API, the keys (all under one
// prefix), the trust domain and the profile of every opensandbox pool are
// required.
func New(cfg Config) (*Backend, error) {
	if cfg.Sandboxes == nil {
		return nil, errors.New("opensandbox backend: no OpenSandbox API")
	}
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("opensandbox backend: no trust domain")
	}
	prefix, err := keysPrefix(cfg.Keys)
	if err != nil {
		return nil, fmt.Errorf("opensandbox backend: %w", err)
	}
	b := &Backend{cfg: cfg, prefix: prefix, terminalKey: prefix + "/terminal", pools: map[string]pool{}}
	maxTimeout := cmp.Or(cfg.MaxTimeout, DefaultMaxTimeout)
	if maxTimeout < time.Minute {
		return nil, fmt.Errorf("opensandbox backend: the server's maximum sandbox timeout %s is below the API's minimum of 1m", maxTimeout)
	}
	for _, p := range cfg.Pools {
		if p.Backend != taskassignment.BackendOpenSandbox {
			continue
		}
		profile, err := ParseProfile(p.Profile)
		if err != nil {
			return nil, fmt.Errorf("opensandbox backend: pool %q: %w", p.Name, err)
		}
		timeout := max(p.Timeout(), time.Minute)
		if timeout > maxTimeout {
			if cfg.Log != nil {
				cfg.Log.Warn("the pool's job timeout exceeds the OpenSandbox server's maximum: its sandboxes live the maximum, and a job that runs longer is removed with its sandbox",
					slog.String("pool", p.Name), slog.Duration("job_timeout", timeout), slog.Duration("sandbox_timeout", maxTimeout))
			}
			timeout = maxTimeout
		}
		b.pools[p.Name] = pool{profile: profile, timeout: timeout, of: p}
	}
	return b, nil
}

// keysPrefix returns the prefix every key of k shares.
func keysPrefix(k taskassignment.Keys) (string, error) {
	prefix, _, ok := strings.Cut(k.Runner, "/")
	if !ok || prefix == "" {
		return "", fmt.Errorf("metadata key %q has no prefix", k.Runner)
	}
	for _, key := range []string{k.Runner, k.AssignmentID, k.TaskID, k.Backend, k.Pool, k.Repository, k.Job, k.SPIFFEID, k.Image} {
		if !strings.HasPrefix(key, prefix+"/") || len(key) == len(prefix)+1 {
			return "", fmt.Errorf("metadata key %q is not under prefix %q", key, prefix)
		}
		if err := sandboxapi.ValidateKey(key); err != nil {
			return "", err
		}
	}
	return prefix, nil
}

func (b *Backend) emit(e Event) {
	if b.cfg.OnEvent != nil {
		b.cfg.OnEvent(e)
	}
}

// Find returns the sandbox labelled with assignmentID (and this
// installation's runner marker), nil if there is none. A sandbox carrying
// the terminal marker is found too, so that it can be deleted, but only when
// the assignment has no other. If a lost create race left two, the oldest is
// the assignment's (see Create).
func (b *Backend) Find(ctx context.Context, assignmentID string) (*executor.Executor, error) {
	sandboxes, err := b.list(ctx, assignmentID)
	if err != nil {
		return nil, err
	}
	if len(sandboxes) == 0 {
		return nil, nil
	}
	return toExecutor(b.pick(sandboxes)), nil
}

func (b *Backend) list(ctx context.Context, assignmentID string) ([]sandboxapi.Sandbox, error) {
	sandboxes, err := b.cfg.Sandboxes.List(ctx, sandboxapi.ListFilter{Metadata: map[string]string{
		b.cfg.Keys.Runner:       "true",
		b.cfg.Keys.AssignmentID: assignmentID,
	}})
	if err != nil {
		return nil, fmt.Errorf("find the sandbox of assignment %s: %w", assignmentID, err)
	}
	return sandboxes, nil
}

// pick returns the sandbox of an assignment among several: the oldest (ties
// broken by ID), the one every racer agrees on, of those not marked
// terminal; the oldest marked one if all are (a deletion to finish).
// sandboxes is not empty.
func (b *Backend) pick(sandboxes []sandboxapi.Sandbox) sandboxapi.Sandbox {
	live := slices.DeleteFunc(slices.Clone(sandboxes), b.terminal)
	if len(live) == 0 {
		live = sandboxes
	}
	return slices.MinFunc(live, compareAge)
}

func (b *Backend) terminal(s sandboxapi.Sandbox) bool { return s.Metadata[b.terminalKey] == "true" }

func compareAge(a, b sandboxapi.Sandbox) int {
	return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
}

// toExecutor is the executor of sandbox s. A Failed sandbox's Reason is the
// server's account of it (on Docker "CONTAINER_EXITED_ERROR: Sandbox
// container exited with code 137." for a container killed mid-job), which
// reaches the job's log when recover fails the task.
func toExecutor(s sandboxapi.Sandbox) *executor.Executor {
	e := &executor.Executor{Name: s.ID, IdentityTarget: s.ID, Phase: phase(s.State)}
	if e.Phase == executor.PhaseFailed {
		e.Reason = failureReason(s)
	}
	return e
}

// failureReason words why sandbox s failed, from the server's reason and
// message (neither carries a credential: the server writes them from the
// container's state).
func failureReason(s sandboxapi.Sandbox) string {
	detail := strings.TrimSpace(strings.Join(slices.DeleteFunc([]string{s.Reason, s.Message}, func(v string) bool { return v == "" }), ": "))
	if detail == "" {
		return fmt.Sprintf("its sandbox %s failed", s.ID)
	}
	return fmt.Sprintf("its sandbox %s failed (%s)", s.ID, detail)
}

// phase maps a sandbox state to the executor phase. Allocated and Resuming
// are on their way to Running; Terminated means the entry process exited 0,
// Failed that it did not (Docker: CONTAINER_EXITED_ERROR, also for a
// container killed at expiry just before its removal; Kubernetes: a Pod in
// CrashLoopBackOff). An expired sandbox is removed, not Terminated: Find no
// longer sees it, and recover fails its task (recoverer's vanished
// executor). Every other state (Paused, Stopping, Unknown, states added
// later) is unknown, which is not terminal.
func phase(s sandboxapi.State) executor.Phase {
	switch s {
	case sandboxapi.StatePending, sandboxapi.StateAllocated, sandboxapi.StateResuming:
		return executor.PhasePending
	case sandboxapi.StateRunning:
		return executor.PhaseRunning
	case sandboxapi.StateTerminated:
		return executor.PhaseSucceeded
	case sandboxapi.StateFailed:
		return executor.PhaseFailed
	}
	return executor.PhaseUnknown
}

// Create returns the sandbox of a, creating it if Find finds none.
//
// Errors no retry can fix are marked executor.Permanent: an assignment
// this backend has no pool for, metadata or an environment the request
// cannot carry, and a create the server refuses with a 4xx other than 401,
// 403, 408, 409 and 429 (see permanent).
//
// The sandbox is made from the profile of a's pool: from the OpenSandbox
// pool it names (extensions.poolRef), or from its image, entrypoint and
// resource limits; a's Task.Image, the job's container image, replaces the
// profile's image (with a pool it is ignored: the pool fixes the image). It
// lives at most the pool's job timeout. Its environment is spec's (plus the
// profile's env and, with a Minter, a freshly minted SVID); its metadata is
// spec's labels as they are plus spec's annotations, encoded.
//
// OpenSandbox has no create-if-absent: two Creates of one assignment that
// both find nothing both create. Each then lists the assignment's sandboxes
// and the one whose sandbox is not the oldest deletes its own and returns
// the oldest. A create whose answer is lost (429, 5xx, no answer) is
// followed by a Find before it is retried. What remains is the window in
// which the server has created a sandbox that its list does not show yet;
// a duplicate born there is still resolved by the same rule, by whichever
// Create sees both, or else left out by recovery until the oldest is gone.
func (b *Backend) Create(ctx context.Context, a taskassignment.Assignment, spec executor.LaunchSpec) (*executor.Executor, error) {
	if e, err := b.Find(ctx, a.ID); err != nil || e != nil {
		return e, err
	}
	req, err := b.createRequest(ctx, a, spec)
	if err != nil {
		return nil, fmt.Errorf("create a sandbox for assignment %s: %w", a.ID, err)
	}
	retry := b.cfg.CreateRetry
	for n := 1; ; n++ {
		created, err := b.cfg.Sandboxes.Create(ctx, req)
		if err == nil {
			return b.settle(ctx, a.ID, created), nil
		}
		if !sandboxapi.Retryable(err) {
			if permanent(err) {
				err = executor.Permanent(err)
			}
			return nil, fmt.Errorf("create a sandbox for assignment %s: %w", a.ID, err)
		}
		// The create may have taken effect: look before creating again.
		e, ferr := b.Find(ctx, a.ID)
		if ferr != nil {
			return nil, fmt.Errorf("create a sandbox for assignment %s: %w (and whether it took effect is unknown: %w)", a.ID, err, ferr)
		}
		if e != nil {
			b.emit(Event{Name: EventCreateAdopted, SandboxID: e.Name, AssignmentID: a.ID, Err: err})
			return e, nil
		}
		if n >= retry.MaxAttempts() {
			return nil, fmt.Errorf("create a sandbox for assignment %s: %d attempts: %w", a.ID, n, err)
		}
		b.emit(Event{Name: EventCreateRetried, AssignmentID: a.ID, Err: err})
		if err := sandboxapi.Sleep(ctx, retry.Delay(n, 0)); err != nil {
			return nil, fmt.Errorf("create a sandbox for assignment %s: %w", a.ID, err)
		}
	}
}

// permanent reports whether a create that failed with err (not retryable)
// fails the same way every time: a 4xx answer other than 401 and 403 (an
// operator can fix the API key), 408, 409 and 429 (time can), or a request
// the client refused to send (invalid metadata). A cancelled or expired
// context is not permanent.
func permanent(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var e *sandboxapi.APIError
	if errors.As(err, &e) {
		switch e.Status {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
			return false
		}
		return e.Status >= 400 && e.Status < 500
	}
	// Not an answer and not retryable: a request the client refused to send.
	return !sandboxapi.Retryable(err)
}

// settle resolves a create race: if an older sandbox of the assignment
// exists, the one just created is deleted and the older one returned.
func (b *Backend) settle(ctx context.Context, assignmentID string, created sandboxapi.Sandbox) *executor.Executor {
	sandboxes, err := b.list(ctx, assignmentID)
	if err != nil {
		// The sandbox exists; a race, if any, is resolved by Find's rule.
		return toExecutor(created)
	}
	winner := b.pick(append(sandboxes, created))
	if winner.ID == created.ID {
		for _, s := range sandboxes {
			if s.ID == created.ID {
				return toExecutor(s) // the listed one is newer news
			}
		}
		return toExecutor(created)
	}
	err = b.cfg.Sandboxes.Delete(ctx, created.ID)
	b.emit(Event{Name: EventDuplicateDeleted, SandboxID: created.ID, AssignmentID: assignmentID, Err: err})
	return toExecutor(winner)
}

func (b *Backend) createRequest(ctx context.Context, a taskassignment.Assignment, spec executor.LaunchSpec) (sandboxapi.CreateRequest, error) {
	var req sandboxapi.CreateRequest
	if a.Backend != taskassignment.BackendOpenSandbox {
		return req, executor.Permanent(fmt.Errorf("the assignment is for backend %q", a.Backend))
	}
	p, ok := b.pools[a.Task.Pool]
	if !ok {
		return req, executor.Permanent(fmt.Errorf("runner pool %q is not an OpenSandbox pool of this backend", a.Task.Pool))
	}
	if err := p.of.CheckImages(a.Task); err != nil {
		return req, executor.Permanent(err)
	}
	labels := spec.Metadata.Labels
	if labels[b.cfg.Keys.AssignmentID] != a.ID || labels[b.cfg.Keys.Runner] != "true" {
		// Without them Find cannot see the sandbox, and Create would not be
		// idempotent.
		return req, executor.Permanent(fmt.Errorf("the labels lack %s=%s or %s=true", b.cfg.Keys.AssignmentID, a.ID, b.cfg.Keys.Runner))
	}
	metadata := maps.Clone(labels)
	chunks, err := EncodeAnnotations(b.prefix, spec.Metadata.Annotations)
	if err != nil {
		return req, executor.Permanent(err)
	}
	for k, v := range chunks {
		if _, clash := metadata[k]; clash {
			return req, executor.Permanent(fmt.Errorf("label %q clashes with an annotation chunk", k))
		}
		metadata[k] = v
	}
	env := maps.Clone(p.profile.Env)
	if env == nil {
		env = map[string]string{}
	}
	add := func(vars map[string]string, from string) error {
		for _, k := range slices.Sorted(maps.Keys(vars)) {
			if _, clash := env[k]; clash {
				return executor.Permanent(fmt.Errorf("%s sets variable %q twice", from, k))
			}
			env[k] = vars[k]
		}
		return nil
	}
	if err := add(spec.Environment, "the executor environment"); err != nil {
		return req, err
	}
	if b.cfg.Minter != nil {
		id, err := spiffeid.FromString(a.Identity.SPIFFEID)
		if err != nil || !id.MemberOf(b.cfg.TrustDomain) {
			return req, executor.Permanent(fmt.Errorf("SPIFFE ID %q is not in trust domain %s", a.Identity.SPIFFEID, b.cfg.TrustDomain))
		}
		svid, err := bootstrap.SVIDEnvironment(ctx, b.cfg.Minter, id, p.timeout)
		if err != nil {
			return req, err
		}
		if err := add(svid, "the minted SVID"); err != nil {
			return req, err
		}
	}
	req = sandboxapi.CreateRequest{Timeout: p.timeout, Env: env, Metadata: metadata}
	if p.profile.PoolRef != "" {
		req.PoolRef = p.profile.PoolRef
		return req, nil
	}
	req.Image = cmp.Or(a.Task.Image, p.profile.Image)
	req.Entrypoint = slices.Clone(p.profile.Entrypoint)
	req.ResourceLimits = maps.Clone(p.profile.ResourceLimits)
	return req, nil
}

// BindIdentity verifies that sandbox e.IdentityTarget carries id: its
// persisted annotations decode and hold exactly id's SPIFFE ID, which is in
// the backend's trust domain. There is nothing to register: no SPIRE agent
// attests a sandbox (its SVID, if any, was minted at creation).
func (b *Backend) BindIdentity(ctx context.Context, e *executor.Executor, id taskidentity.Identity) error {
	if e == nil || e.IdentityTarget == "" {
		return errors.New("bind identity: no sandbox")
	}
	want, err := spiffeid.FromString(id.SPIFFEID)
	if err != nil || !want.MemberOf(b.cfg.TrustDomain) {
		return fmt.Errorf("bind identity to sandbox %s: SPIFFE ID %q is not in trust domain %s", e.IdentityTarget, id.SPIFFEID, b.cfg.TrustDomain)
	}
	s, err := b.cfg.Sandboxes.Get(ctx, e.IdentityTarget)
	if sandboxapi.IsNotFound(err) {
		return fmt.Errorf("bind identity to sandbox %s: the sandbox is gone (expired or deleted): %w", e.IdentityTarget, err)
	}
	if err != nil {
		return fmt.Errorf("bind identity to sandbox %s: %w", e.IdentityTarget, err)
	}
	annotations, err := DecodeAnnotations(b.prefix, s.Metadata)
	if err != nil {
		return fmt.Errorf("bind identity to sandbox %s: %w", e.IdentityTarget, err)
	}
	if got := annotations[b.cfg.Keys.SPIFFEID]; got != want.String() {
		return fmt.Errorf("bind identity to sandbox %s: it carries SPIFFE ID %q, not %q", e.IdentityTarget, got, want)
	}
	return nil
}

// Delete deletes sandbox e.Name; one already gone is deleted. First it
// marks the sandbox terminal (<prefix>/terminal=true), so that recovery
// leaves it out from then on: the worker deletes a sandbox only once its
// outcome is with Gitea (reported, or the task was over). A marked sandbox
// whose deletion failed is deleted by the next RecoverAssignments. If the
// mark cannot be set the sandbox is deleted all the same.
func (b *Backend) Delete(ctx context.Context, e *executor.Executor) error {
	if e == nil || e.Name == "" {
		return errors.New("delete: no sandbox")
	}
	mark := "true"
	_, markErr := b.cfg.Sandboxes.PatchMetadata(ctx, e.Name, map[string]*string{b.terminalKey: &mark})
	if sandboxapi.IsNotFound(markErr) {
		return nil
	}
	if err := b.cfg.Sandboxes.Delete(ctx, e.Name); err != nil {
		if markErr != nil {
			return fmt.Errorf("delete sandbox %s: %w (marking it terminal failed too: %w)", e.Name, err, markErr)
		}
		return fmt.Errorf("delete sandbox %s: %w", e.Name, err)
	}
	return nil
}

// RecoverAssignments returns the assignment of every sandbox of this
// installation (the runner marker), over all pages, rebuilt from its
// metadata alone. It leaves out, without failing:
//   - sandboxes carrying the terminal marker, whose deletion it finishes
//     (EventSkippedTerminal);
//   - sandboxes whose annotations do not decode or whose metadata does not
//     rebuild a valid opensandbox assignment in the trust domain (reported
//     to OnCorrupt);
//   - all but the oldest sandbox of one assignment (EventSkippedDuplicate).
//
// Only a failure to list is an error.
func (b *Backend) RecoverAssignments(ctx context.Context) ([]taskassignment.Assignment, error) {
	sandboxes, err := b.cfg.Sandboxes.List(ctx, sandboxapi.ListFilter{Metadata: b.cfg.Keys.RunnerSelector()})
	if err != nil {
		return nil, fmt.Errorf("list the sandboxes of this installation: %w", err)
	}
	slices.SortFunc(sandboxes, compareAge)
	var out []taskassignment.Assignment
	seen := map[string]bool{}
	for _, s := range sandboxes {
		if b.terminal(s) {
			err := b.cfg.Sandboxes.Delete(ctx, s.ID)
			b.emit(Event{Name: EventSkippedTerminal, SandboxID: s.ID, AssignmentID: s.Metadata[b.cfg.Keys.AssignmentID], Err: err})
			continue
		}
		a, err := b.assignment(s)
		if err != nil {
			if b.cfg.OnCorrupt != nil {
				b.cfg.OnCorrupt(s.ID, err)
			}
			continue
		}
		if seen[a.ID] {
			b.emit(Event{Name: EventSkippedDuplicate, SandboxID: s.ID, AssignmentID: a.ID})
			continue
		}
		seen[a.ID] = true
		out = append(out, a)
	}
	return out, nil
}

// assignment rebuilds the assignment of sandbox s from its metadata.
func (b *Backend) assignment(s sandboxapi.Sandbox) (taskassignment.Assignment, error) {
	annotations, err := DecodeAnnotations(b.prefix, s.Metadata)
	if err != nil {
		return taskassignment.Assignment{}, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	a, err := b.cfg.Keys.FromMetadata(s.Metadata, annotations, b.cfg.TrustDomain)
	if err != nil {
		return taskassignment.Assignment{}, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	if a.Backend != taskassignment.BackendOpenSandbox {
		return taskassignment.Assignment{}, fmt.Errorf("sandbox %s: assignment %s is for backend %q", s.ID, a.ID, a.Backend)
	}
	return a, nil
}
