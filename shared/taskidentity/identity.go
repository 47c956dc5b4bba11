// Package taskidentity derives the per-task SPIFFE identity of an executor.
//
// Every executor runs as spiffe://<trust-domain>/repo/<owner>/<name>/task/<task-id>.
// The path is built only from the lower-cased repository owner and name and the
// numeric Gitea task ID, never from free text, so the same task always maps to
// the same ID and no two tasks share one.
package taskidentity

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// maxIDLength keeps SPIFFE IDs well inside what X.509 URI SANs and SPIRE
// entries accept.
const maxIDLength = 255

// Identity is the identity context of one executor.
type Identity struct {
	// Repository is "owner/name" exactly as Gitea's task context has it.
	Repository string
	// Task is the workflow's job key (the YAML key, Gitea's context "job").
	Task string
	// SPIFFEID is the executor's SPIFFE ID; see New for its shape.
	SPIFFEID string
}

// New builds the identity of the Gitea task taskID of repository ("owner/name")
// running the job key job, in trust domain td.
func New(td spiffeid.TrustDomain, repository, job string, taskID int64) (Identity, error) {
	if td.IsZero() {
		return Identity{}, errors.New("task identity: trust domain is empty")
	}
	if taskID <= 0 {
		return Identity{}, fmt.Errorf("task identity: task ID %d is not positive", taskID)
	}
	if job == "" {
		return Identity{}, fmt.Errorf("task identity: task %d has no job key", taskID)
	}
	owner, name, ok := strings.Cut(repository, "/")
	if !ok || owner == "" || name == "" || strings.Contains(name, "/") {
		return Identity{}, fmt.Errorf("task identity: repository %q is not owner/name", repository)
	}
	id, err := spiffeid.FromSegments(td, "repo", strings.ToLower(owner), strings.ToLower(name),
		"task", strconv.FormatInt(taskID, 10))
	if err != nil {
		return Identity{}, fmt.Errorf("task identity: repository %q: %w", repository, err)
	}
	if s := id.String(); len(s) > maxIDLength {
		return Identity{}, fmt.Errorf("task identity: SPIFFE ID for repository %q is %d characters, more than %d",
			repository, len(s), maxIDLength)
	}
	return Identity{Repository: repository, Task: job, SPIFFEID: id.String()}, nil
}

// FromTask builds the identity of a task Gitea handed out, from the
// "repository" and "job" keys of its context.
func FromTask(td spiffeid.TrustDomain, task *runnerv1.Task) (Identity, error) {
	if task == nil {
		return Identity{}, errors.New("task identity: no task")
	}
	fields := task.GetContext().GetFields()
	repository := fields["repository"].GetStringValue()
	job := fields["job"].GetStringValue()
	if repository == "" {
		return Identity{}, fmt.Errorf("task identity: task %d context has no repository", task.GetId())
	}
	return New(td, repository, job, task.GetId())
}

// FromMetadata rebuilds an identity read back from backend metadata. It
// rejects a SPIFFE ID that is not the one New derives for the same trust
// domain, repository and task, so metadata can neither move an executor into
// another trust domain nor borrow another task's identity.
func FromMetadata(td spiffeid.TrustDomain, repository, job string, taskID int64, spiffeID string) (Identity, error) {
	if spiffeID == "" {
		return Identity{}, fmt.Errorf("task identity: task %d has no SPIFFE ID", taskID)
	}
	got, err := spiffeid.FromString(spiffeID)
	if err != nil {
		return Identity{}, fmt.Errorf("task identity: task %d SPIFFE ID %q: %w", taskID, spiffeID, err)
	}
	if !got.MemberOf(td) {
		return Identity{}, fmt.Errorf("task identity: task %d SPIFFE ID %q is outside trust domain %q",
			taskID, spiffeID, td.Name())
	}
	want, err := New(td, repository, job, taskID)
	if err != nil {
		return Identity{}, err
	}
	if want.SPIFFEID != spiffeID {
		return Identity{}, fmt.Errorf("task identity: task %d SPIFFE ID %q does not match repository %q (want %q)",
			taskID, spiffeID, repository, want.SPIFFEID)
	}
	return want, nil
}

// Parse reads a task identity back: the lower-cased repository
// ("owner/name") and the task ID of id, which must be exactly of the shape
// New builds in trust domain td. It is how a verified SVID names its task.
func Parse(td spiffeid.TrustDomain, id spiffeid.ID) (repository string, taskID int64, err error) {
	segs := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/")
	if !id.MemberOf(td) || len(segs) != 5 || segs[0] != "repo" || segs[3] != "task" {
		return "", 0, fmt.Errorf("task identity: %s is not a task identity of trust domain %q", id, td.Name())
	}
	n, err := strconv.ParseInt(segs[4], 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != segs[4] {
		return "", 0, fmt.Errorf("task identity: %s has no valid task ID", id)
	}
	return segs[1] + "/" + segs[2], n, nil
}
