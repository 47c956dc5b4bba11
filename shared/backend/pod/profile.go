package pod

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// RunnerContainer is the fixed name of the container in a pool's pod template
// that runs the one-shot runner: it receives the executor environment and the
// job's container image, and runs the injected runner (see RunnerPath).
const RunnerContainer = "runner"

// Profile is the pod backend's part of a runner pool (runnerpool.Pool.Profile).
// Exactly one of PodTemplate and PodTemplateFile is set. In YAML:
//
//	profile:
//	  runnerImage: registry.example.com/gdr-runner:v1   # optional
//	  workloadAPI: {csiDriver: csi.spiffe.io}           # optional, the default
//	  podTemplate:            # a corev1.PodTemplateSpec
//	    metadata: {labels: {team: ci}}
//	    spec:
//	      containers:
//	      - name: runner
//	        image: registry.example.com/gdr-runner-host:v1
//
// or
//
//	profile:
//	  podTemplateFile: /etc/gdr/pod-templates/default.yaml
//
// A template kept in a ConfigMap is used by mounting the ConfigMap as a volume
// and naming the mounted file in podTemplateFile.
type Profile struct {
	// PodTemplate is the template inline.
	PodTemplate *corev1.PodTemplateSpec `json:"podTemplate,omitempty"`
	// PodTemplateFile is a YAML or JSON file holding one PodTemplateSpec. It
	// is read once, when the backend is constructed.
	PodTemplateFile string `json:"podTemplateFile,omitempty"`
	// RunnerImage is the image the init container copies the runner from:
	// its entrypoint must be the static runner (the `runner` image of make
	// images), which `install <path>` copies. Default: the runner
	// container's image in the template (runner-host's entrypoint is the
	// runner too), never the job's.
	RunnerImage string `json:"runnerImage,omitempty"`
	// RunnerInImage is the runner's path in the image of the template's
	// runner container, when that image holds it (runner-host:
	// /usr/local/bin/runner). A job without `container:` then runs it from
	// there: no install init container and no runner volume, so one
	// container start (and the kubelet noticing its exit) less before the
	// job starts. A job's own image still gets the runner installed from
	// RunnerImage.
	RunnerInImage string `json:"runnerInImage,omitempty"`
	// WorkloadAPI is how the runner reaches the SPIRE agent. Default: the
	// SPIFFE CSI driver csi.spiffe.io.
	WorkloadAPI *WorkloadAPI `json:"workloadAPI,omitempty"`
	// ServiceTimeout is how long the runner waits for the ports of a job's
	// `services:` to accept connections before it fails the job. Default
	// DefaultServiceTimeout.
	ServiceTimeout *metav1.Duration `json:"serviceTimeout,omitempty"`
	// ServiceMemory is the memory request and limit of each of a job's
	// `services:` that passes no --memory (a service's --memory sets both).
	// Default DefaultServiceMemory.
	ServiceMemory string `json:"serviceMemory,omitempty"`
	// Build, when set, gives every job of the pool a rootless BuildKit at
	// BUILDKIT_HOST (see BuildKit); off by default.
	Build *BuildKit `json:"build,omitempty"`
	// Docker, when set, gives every job of the pool a rootless Docker
	// daemon at DOCKER_HOST (see Docker); off by default.
	Docker *Docker `json:"docker,omitempty"`
}

// serviceDefaults returns what the profile sets for a job's services, or
// the defaults: how long the runner waits for their ports, and the memory
// request and limit of a service that sets no --memory. The profile is one
// ParseProfile accepted.
func serviceDefaults(raw json.RawMessage) (time.Duration, resource.Quantity, error) {
	var p Profile
	if err := yaml.Unmarshal(raw, &p); err != nil {
		return 0, resource.Quantity{}, fmt.Errorf("profile: %w", err)
	}
	timeout := DefaultServiceTimeout
	if p.ServiceTimeout != nil {
		if timeout = p.ServiceTimeout.Duration; timeout <= 0 {
			return 0, resource.Quantity{}, fmt.Errorf("profile serviceTimeout: %s is not positive", timeout)
		}
	}
	memory, err := resource.ParseQuantity(cmp.Or(p.ServiceMemory, DefaultServiceMemory))
	switch {
	case err != nil:
		return 0, resource.Quantity{}, fmt.Errorf("profile serviceMemory: %q is not a quantity such as 512Mi: %w", p.ServiceMemory, err)
	case memory.Sign() <= 0:
		return 0, resource.Quantity{}, fmt.Errorf("profile serviceMemory: %s is not positive", memory.String())
	}
	return timeout, memory, nil
}

// ParseProfile reads a pool's profile (JSON, as runnerpool keeps it) and
// returns its validated pod template with the runner injection and the
// Workload API volume added (see inject): every Pod of the pool is this
// template with the job's metadata, environment Secret and image. Unknown
// fields, in the profile and in the template, are errors; so is every rule of
// validateTemplate and checkReserved. Errors name the field at fault; the
// caller adds the pool.
func ParseProfile(raw json.RawMessage, keys taskassignment.Keys) (corev1.PodTemplateSpec, error) {
	t, err := parseProfile(raw, keys, true)
	return t.install, err
}

// templates are a pool's pod templates: install for a job in its own image
// (and every job without RunnerInImage), direct (nil without RunnerInImage)
// for a job that runs in the template's image, which holds the runner.
type templates struct {
	install corev1.PodTemplateSpec
	direct  *corev1.PodTemplateSpec
}

// parseProfile is ParseProfile, with the direct template as well; without
// workloadAPI (a backend that mints SVIDs) the templates get no Workload API
// volume, and the profile's workloadAPI is still validated but unused.
func parseProfile(raw json.RawMessage, keys taskassignment.Keys, workloadAPI bool) (templates, error) {
	tmpl, direct, err := parseTemplates(raw, keys, workloadAPI)
	return templates{install: tmpl, direct: direct}, err
}

func parseTemplates(raw json.RawMessage, keys taskassignment.Keys, workloadAPI bool) (corev1.PodTemplateSpec, *corev1.PodTemplateSpec, error) {
	if len(raw) == 0 {
		return corev1.PodTemplateSpec{}, nil, errors.New("profile is missing: set podTemplate or podTemplateFile")
	}
	var p Profile
	if err := yaml.UnmarshalStrict(raw, &p); err != nil {
		return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile: %w", err)
	}
	var (
		tmpl  corev1.PodTemplateSpec
		field string
	)
	switch {
	case p.PodTemplate != nil && p.PodTemplateFile != "":
		return corev1.PodTemplateSpec{}, nil, errors.New("profile: podTemplate and podTemplateFile are both set; set one")
	case p.PodTemplate != nil:
		tmpl, field = *p.PodTemplate, "podTemplate"
	case p.PodTemplateFile != "":
		data, err := os.ReadFile(p.PodTemplateFile)
		if err != nil {
			return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile podTemplateFile: %w", err)
		}
		if err := yaml.UnmarshalStrict(data, &tmpl); err != nil {
			return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile podTemplateFile %s: %w", p.PodTemplateFile, err)
		}
		field = "podTemplateFile " + p.PodTemplateFile + ":"
	default:
		return corev1.PodTemplateSpec{}, nil, errors.New("profile: set podTemplate or podTemplateFile")
	}
	if err := validateTemplate(tmpl, keys); err != nil {
		return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile %s %w", field, err)
	}
	if err := checkReserved(tmpl.Spec); err != nil {
		return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile %s %w", field, err)
	}
	if err := checkBuildReserved(tmpl.Spec); err != nil {
		return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile %s %w", field, err)
	}
	if p.Build != nil {
		if err := p.Build.validate(); err != nil {
			return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile build: %w", err)
		}
		injectBuild(&tmpl, *p.Build)
	}
	if err := checkDockerReserved(tmpl.Spec); err != nil {
		return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile %s %w", field, err)
	}
	if p.Docker != nil {
		if err := p.Docker.validate(); err != nil {
			return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile docker: %w", err)
		}
		work, err := workMount(tmpl.Spec.Containers[runnerIndex(tmpl.Spec.Containers)])
		if err == nil {
			err = checkDockerUserNamespace(tmpl.Spec, *p.Docker)
		}
		if err != nil {
			return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile docker: %w", err)
		}
		injectDocker(&tmpl, *p.Docker, work)
	}
	var w WorkloadAPI
	if p.WorkloadAPI != nil {
		w = *p.WorkloadAPI
	}
	if err := w.validate(); err != nil {
		return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile workloadAPI: %w", err)
	}
	image := p.RunnerImage
	if image == "" {
		image = tmpl.Spec.Containers[runnerIndex(tmpl.Spec.Containers)].Image
	}
	if p.RunnerInImage != "" && (!path.IsAbs(p.RunnerInImage) || path.Clean(p.RunnerInImage) != p.RunnerInImage) {
		return corev1.PodTemplateSpec{}, nil, fmt.Errorf("profile runnerInImage %q: want a clean absolute path", p.RunnerInImage)
	}
	wp := &w
	if !workloadAPI {
		wp = nil
	}
	var direct *corev1.PodTemplateSpec
	if p.RunnerInImage != "" {
		direct = tmpl.DeepCopy()
		injectDirect(direct, p.RunnerInImage, wp)
	}
	inject(&tmpl, image, wp)
	return tmpl, direct, nil
}

// validateTemplate enforces what Create relies on. The error starts with the
// offending field, relative to the template.
func validateTemplate(t corev1.PodTemplateSpec, keys taskassignment.Keys) error {
	if t.Name != "" || t.GenerateName != "" || t.Namespace != "" {
		return errors.New("metadata: name, generateName and namespace are set by the backend; leave them empty")
	}
	reserved := []string{keys.Runner, keys.AssignmentID, keys.TaskID, keys.Backend, keys.Pool,
		keys.Repository, keys.Job, keys.SPIFFEID, keys.Image}
	for k := range t.Labels {
		if slices.Contains(reserved, k) {
			return fmt.Errorf("metadata.labels: %q is a metadata contract key set by the backend", k)
		}
	}
	for k := range t.Annotations {
		if slices.Contains(reserved, k) {
			return fmt.Errorf("metadata.annotations: %q is a metadata contract key set by the backend", k)
		}
	}
	switch t.Spec.RestartPolicy {
	case "", corev1.RestartPolicyNever:
	default:
		return fmt.Errorf("spec.restartPolicy: %q: an executor runs once, only Never is allowed", t.Spec.RestartPolicy)
	}
	i := runnerIndex(t.Spec.Containers)
	if i < 0 {
		return fmt.Errorf("spec.containers: no container named %q", RunnerContainer)
	}
	if t.Spec.Containers[i].Image == "" {
		return fmt.Errorf("spec.containers[%s].image: empty", RunnerContainer)
	}
	return nil
}

func runnerIndex(cs []corev1.Container) int {
	return slices.IndexFunc(cs, func(c corev1.Container) bool { return c.Name == RunnerContainer })
}
