// Package taskassignment defines the unit of work that flows from dispatch to
// a backend: one claimed Gitea task, the backend that runs it, and the
// identity its executor gets.
//
// An Assignment is fully determined by the task: the same task claimed by the
// same runner pool always yields the same ID, so a redelivery, a re-publish or
// a recovery after a crash all address the same executor.
package taskassignment

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// BackendKind names the kind of executor that runs an assignment. It is part of
// the queue subject (ci.assignment.<backend>) and of backend metadata.
type BackendKind string

const (
	// BackendPod runs the task in a Kubernetes Pod.
	BackendPod BackendKind = "pod"
	// BackendOpenSandbox runs the task in an OpenSandbox sandbox.
	BackendOpenSandbox BackendKind = "opensandbox"
	// BackendProcess runs the task as a local child process (local mode).
	BackendProcess BackendKind = "process"
)

var backends = []BackendKind{BackendPod, BackendOpenSandbox, BackendProcess}

// BackendKinds returns every known backend, in a fixed order.
func BackendKinds() []BackendKind { return append([]BackendKind(nil), backends...) }

// ParseBackendKind returns the backend named s, or an error naming s.
func ParseBackendKind(s string) (BackendKind, error) {
	for _, b := range backends {
		if string(b) == s {
			return b, nil
		}
	}
	return "", fmt.Errorf("unknown backend %q (want one of %v)", s, backends)
}

// MaxPoolLength bounds pool names so that "<pool>-<task ID>" stays a valid
// label value for every int64 task ID (19 digits and a dash).
const MaxPoolLength = validation.LabelValueMaxLength - 20

var poolPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// ValidatePool reports whether name may name a runner pool: a DNS label of at
// most MaxPoolLength characters.
func ValidatePool(name string) error {
	if name == "" {
		return errors.New("runner pool name is empty")
	}
	if len(name) > MaxPoolLength {
		return fmt.Errorf("runner pool name %q is longer than %d characters", name, MaxPoolLength)
	}
	if !poolPattern.MatchString(name) {
		return fmt.Errorf("runner pool name %q must be lower-case letters, digits and inner dashes", name)
	}
	return nil
}

// ID returns the assignment ID of task taskID claimed by pool: "<pool>-<taskID>".
// It is deterministic, distinct for distinct (pool, task) pairs (the task ID has
// no dash), and a valid Kubernetes label value, JetStream message ID and KV key.
func ID(pool string, taskID int64) (string, error) {
	if err := ValidatePool(pool); err != nil {
		return "", err
	}
	if taskID <= 0 {
		return "", fmt.Errorf("task ID %d is not positive", taskID)
	}
	return pool + "-" + strconv.FormatInt(taskID, 10), nil
}

// ParseID returns the pool and task ID an assignment ID was made of; it is
// the inverse of ID.
func ParseID(id string) (pool string, taskID int64, err error) {
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return "", 0, fmt.Errorf("assignment ID %q is not <pool>-<task ID>", id)
	}
	taskID, err = strconv.ParseInt(id[i+1:], 10, 64)
	if err != nil || taskID <= 0 {
		return "", 0, fmt.Errorf("assignment ID %q is not <pool>-<task ID>", id)
	}
	if again, err := ID(id[:i], taskID); err != nil || again != id {
		return "", 0, fmt.Errorf("assignment ID %q is not <pool>-<task ID>", id)
	}
	return id[:i], taskID, nil
}

// Task is the part of a claimed Gitea task that travels with its assignment.
// It holds nothing secret: the task's token and secrets stay in the sealed
// payload store.
type Task struct {
	// ID is Gitea's task ID. Gitea never reuses it.
	ID int64
	// Pool is the runner pool whose registration claimed the task. Only that
	// registration may report on the task.
	Pool string
	// Image is the image of the job's `container:`, empty when the job runs
	// on the executor's own image.
	Image string
	// Services are the job's `services:`, sorted by ID, as the workflow
	// writes them (no expression evaluated, no credentials): a backend that
	// runs services builds them from here, never from an unsigned source.
	Services []jobservices.Service
}

// Assignment is one claimed task bound to one backend.
type Assignment struct {
	ID       string
	Backend  BackendKind
	Task     Task
	Identity taskidentity.Identity
}

// New returns the assignment of task to backend with the given identity, its
// ID derived from the task.
func New(backend BackendKind, task Task, identity taskidentity.Identity) (Assignment, error) {
	id, err := ID(task.Pool, task.ID)
	if err != nil {
		return Assignment{}, fmt.Errorf("assignment of task %d: %w", task.ID, err)
	}
	a := Assignment{ID: id, Backend: backend, Task: task, Identity: identity}
	if _, err := ParseBackendKind(string(backend)); err != nil {
		return Assignment{}, fmt.Errorf("assignment %s: %w", id, err)
	}
	return a, nil
}

// Validate checks every invariant an assignment read from outside (a queue
// message, backend metadata) must hold: a known backend, an ID derived from
// its task, and an identity that is exactly the task's identity in td.
func (a Assignment) Validate(td spiffeid.TrustDomain) error {
	if _, err := ParseBackendKind(string(a.Backend)); err != nil {
		return fmt.Errorf("assignment %s: %w", a.ID, err)
	}
	want, err := ID(a.Task.Pool, a.Task.ID)
	if err != nil {
		return fmt.Errorf("assignment %s: %w", a.ID, err)
	}
	if a.ID != want {
		return fmt.Errorf("assignment %q: ID does not match pool %q and task %d (want %q)", a.ID, a.Task.Pool, a.Task.ID, want)
	}
	if _, err := taskidentity.FromMetadata(td, a.Identity.Repository, a.Identity.Task, a.Task.ID, a.Identity.SPIFFEID); err != nil {
		return fmt.Errorf("assignment %s: %w", a.ID, err)
	}
	return nil
}
