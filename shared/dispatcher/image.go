package dispatcher

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

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
