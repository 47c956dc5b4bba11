// Package taskworkflow reads what the assignment of a Gitea task takes from
// its workflow payload (Gitea sends a single-job workflow): the image of the
// job's `container:` and its `services:`, the latter with act's workflow
// model, as the runner reads them. dispatch builds an assignment with it when
// it claims a task and recover when it re-publishes one, and both get the
// same one (FromTask).
//
// It is a package of its own so that what only decodes, checks or runs an
// assignment (handle, the backends) does not link act's model, which pulls
// in go-git and OpenPGP with their package initialisation.
package taskworkflow

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nektos/act/pkg/model"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// FromTask builds the assignment of a task Gitea handed out to pool (run by
// backend): its identity from the task's context in trust domain td, and the
// image of its job's `container:` and its `services:`. dispatch builds it when it claims the
// task and recover when it re-publishes it, and both get the same one.
func FromTask(td spiffeid.TrustDomain, backend taskassignment.BackendKind, pool string, task *runnerv1.Task) (taskassignment.Assignment, error) {
	identity, err := taskidentity.FromTask(td, task)
	if err != nil {
		return taskassignment.Assignment{}, err
	}
	image, err := JobImage(task.GetWorkflowPayload())
	if err != nil {
		return taskassignment.Assignment{}, fmt.Errorf("task %d: %w", task.GetId(), err)
	}
	services, err := FromWorkflow(task.GetWorkflowPayload())
	if err != nil {
		return taskassignment.Assignment{}, fmt.Errorf("task %d: %w", task.GetId(), err)
	}
	return taskassignment.New(backend, taskassignment.Task{ID: task.GetId(), Pool: pool, Image: image, Services: services}, identity)
}

// JobImage returns the image of the job's `container:` in a task's workflow
// payload (Gitea sends a single-job workflow), or "" when the job has none.
// `container:` is either the image or a mapping with an `image:` key.
func JobImage(payload []byte) (string, error) {
	var wf struct {
		Jobs map[string]struct {
			Container any `json:"container"`
		} `json:"jobs"`
	}
	if err := yaml.Unmarshal(payload, &wf); err != nil {
		return "", fmt.Errorf("workflow payload is not YAML: %w", err)
	}
	if len(wf.Jobs) != 1 {
		return "", fmt.Errorf("workflow payload has %d jobs, want exactly 1", len(wf.Jobs))
	}
	for _, job := range wf.Jobs {
		switch c := job.Container.(type) {
		case nil:
			return "", nil
		case string:
			return c, nil
		case map[string]any:
			image, ok := c["image"].(string)
			if !ok {
				return "", fmt.Errorf("job container has no image")
			}
			return image, nil
		default:
			return "", fmt.Errorf("job container is a %T, want an image or a mapping", c)
		}
	}
	return "", nil
}

// FromWorkflow returns the services of the single job of a task's workflow
// payload, sorted by ID; none when the job has no `services:`. It uses act's
// workflow model, as the runner does.
func FromWorkflow(payload []byte) ([]jobservices.Service, error) {
	wf, err := model.ReadWorkflow(bytes.NewReader(payload))
	if err != nil {
		return nil, fmt.Errorf("workflow payload: %w", err)
	}
	ids := wf.GetJobIDs()
	if len(ids) != 1 {
		return nil, fmt.Errorf("workflow payload has %d jobs, want exactly 1", len(ids))
	}
	return FromJob(wf.GetJob(ids[0]))
}

// FromJob returns the services of job, sorted by ID.
func FromJob(job *model.Job) ([]jobservices.Service, error) {
	var out []jobservices.Service
	for id, spec := range job.Services {
		if spec == nil {
			return nil, fmt.Errorf("service %q: empty", id)
		}
		if spec.Image == "" {
			return nil, fmt.Errorf("service %q: no image", id)
		}
		out = append(out, jobservices.Service{
			ID: id, Image: spec.Image, Env: spec.Env, Ports: spec.Ports, Volumes: spec.Volumes,
			Cmd: spec.Cmd, Options: spec.Options, Credentials: len(spec.Credentials) > 0,
		})
	}
	slices.SortFunc(out, func(a, b jobservices.Service) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
