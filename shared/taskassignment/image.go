package taskassignment

import (
	"fmt"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservice"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// FromTask builds the assignment of a task Gitea handed out to pool (run by
// backend): its identity from the task's context in trust domain td, and the
// image of its job's `container:` and its `services:`. dispatch builds it when it claims the
// task and recover when it re-publishes it, and both get the same one.
func FromTask(td spiffeid.TrustDomain, backend Backend, pool string, task *runnerv1.Task) (Assignment, error) {
	identity, err := taskidentity.FromTask(td, task)
	if err != nil {
		return Assignment{}, err
	}
	image, err := JobImage(task.GetWorkflowPayload())
	if err != nil {
		return Assignment{}, fmt.Errorf("task %d: %w", task.GetId(), err)
	}
	services, err := jobservice.FromWorkflow(task.GetWorkflowPayload())
	if err != nil {
		return Assignment{}, fmt.Errorf("task %d: %w", task.GetId(), err)
	}
	return New(backend, Task{ID: task.GetId(), Pool: pool, Image: image, Services: services}, identity)
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
