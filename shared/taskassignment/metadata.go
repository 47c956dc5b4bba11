package taskassignment

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// DefaultPrefix is the metadata key prefix used when none is configured.
const DefaultPrefix = "gitea-dynamic-runner.io"

// Metadata is what a backend persists on an executor so that the assignment
// can be rebuilt from the backend alone. Labels are query-safe (valid label
// values, usable in selectors); annotations keep the full identity context.
// Neither ever holds an environment value or a credential.
type Metadata struct {
	Labels      map[string]string
	Annotations map[string]string
}

// Keys are the metadata keys of the contract under one prefix. Every backend
// of one installation must use the same prefix: recovery finds executors by it.
type Keys struct {
	// Labels.
	Runner       string // "true" on every executor of this installation
	AssignmentID string
	TaskID       string
	Backend      string
	Pool         string
	// Annotations.
	Repository string
	Job        string
	SPIFFEID   string
	Image      string
}

// NewKeys returns the keys under prefix, a DNS subdomain such as
// "ci.example.com".
func NewKeys(prefix string) (Keys, error) {
	if errs := validation.IsDNS1123Subdomain(prefix); len(errs) > 0 {
		return Keys{}, fmt.Errorf("metadata key prefix %q: %s", prefix, strings.Join(errs, "; "))
	}
	k := func(name string) string { return prefix + "/" + name }
	return Keys{
		Runner:       k("runner"),
		AssignmentID: k("assignment-id"),
		TaskID:       k("task-id"),
		Backend:      k("backend"),
		Pool:         k("pool"),
		Repository:   k("repository"),
		Job:          k("job-key"),
		SPIFFEID:     k("spiffe-id"),
		Image:        k("image"),
	}, nil
}

// RunnerSelector is the label set that every executor of this installation
// carries, for listing them all.
func (k Keys) RunnerSelector() map[string]string {
	return map[string]string{k.Runner: "true"}
}

// Metadata returns the labels and annotations to persist for a.
func (k Keys) Metadata(a Assignment) Metadata {
	m := Metadata{
		Labels: map[string]string{
			k.Runner:       "true",
			k.AssignmentID: a.ID,
			k.TaskID:       strconv.FormatInt(a.Task.ID, 10),
			k.Backend:      string(a.Backend),
			k.Pool:         a.Task.Pool,
		},
		Annotations: map[string]string{
			k.Repository: a.Identity.Repository,
			k.Job:        a.Identity.Task,
			k.SPIFFEID:   a.Identity.SPIFFEID,
		},
	}
	if a.Task.Image != "" {
		m.Annotations[k.Image] = a.Task.Image
	}
	return m
}

// FromMetadata rebuilds the assignment persisted by Metadata and validates it
// in trust domain td (see Assignment.Validate). A missing or empty key, a
// malformed task ID, an identity outside td or one that does not match the
// repository and task are errors naming the key or value at fault.
func (k Keys) FromMetadata(labels, annotations map[string]string, td spiffeid.TrustDomain) (Assignment, error) {
	get := func(kind string, m map[string]string, key string) (string, error) {
		v, ok := m[key]
		if !ok {
			return "", fmt.Errorf("metadata: %s %q is missing", kind, key)
		}
		if v == "" {
			return "", fmt.Errorf("metadata: %s %q is empty", kind, key)
		}
		return v, nil
	}
	var (
		values = make(map[string]string)
		err    error
	)
	for _, f := range []struct {
		kind string
		m    map[string]string
		key  string
	}{
		{"label", labels, k.Runner},
		{"label", labels, k.AssignmentID},
		{"label", labels, k.TaskID},
		{"label", labels, k.Backend},
		{"label", labels, k.Pool},
		{"annotation", annotations, k.Repository},
		{"annotation", annotations, k.Job},
		{"annotation", annotations, k.SPIFFEID},
	} {
		if values[f.key], err = get(f.kind, f.m, f.key); err != nil {
			return Assignment{}, err
		}
	}
	if values[k.Runner] != "true" {
		return Assignment{}, fmt.Errorf("metadata: label %q is %q, not \"true\"", k.Runner, values[k.Runner])
	}
	taskID, err := strconv.ParseInt(values[k.TaskID], 10, 64)
	if err != nil || taskID <= 0 || strconv.FormatInt(taskID, 10) != values[k.TaskID] {
		return Assignment{}, fmt.Errorf("metadata: label %q = %q is not a task ID", k.TaskID, values[k.TaskID])
	}
	a := Assignment{
		ID:      values[k.AssignmentID],
		Backend: BackendKind(values[k.Backend]),
		Task:    Task{ID: taskID, Pool: values[k.Pool], Image: annotations[k.Image]},
		Identity: taskidentity.Identity{
			Repository: values[k.Repository],
			Task:       values[k.Job],
			SPIFFEID:   values[k.SPIFFEID],
		},
	}
	if err := a.Validate(td); err != nil {
		return Assignment{}, fmt.Errorf("metadata: %w", err)
	}
	return a, nil
}

// NamingSettings is the installation-wide naming every function must agree on.
type NamingSettings struct {
	TrustDomain    string `envconfig:"GDR_TRUST_DOMAIN" required:"true" desc:"SPIFFE trust domain of executor identities"`
	MetadataPrefix string `envconfig:"GDR_METADATA_PREFIX" default:"gitea-dynamic-runner.io" desc:"key prefix of executor labels and annotations"`
}

// Check reports what Parse would fail on.
func (n NamingSettings) Check() error {
	_, _, err := n.Parse()
	return err
}

// Parse returns the trust domain and the metadata keys of n.
func (n NamingSettings) Parse() (spiffeid.TrustDomain, Keys, error) {
	td, err := spiffeid.TrustDomainFromString(n.TrustDomain)
	if err == nil && td.Name() != n.TrustDomain {
		err = fmt.Errorf("want a bare name such as %q", td.Name())
	}
	if err != nil {
		return spiffeid.TrustDomain{}, Keys{}, fmt.Errorf("trust domain %q: %w", n.TrustDomain, err)
	}
	keys, err := NewKeys(n.MetadataPrefix)
	return td, keys, err
}
