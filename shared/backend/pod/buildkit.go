package pod

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// What a pool's build capability (Profile.Build, a BuildKit) adds to its Pods. The
// names and the socket folder are reserved in every template.
const (
	// BuildContainer is the native sidecar running rootless BuildKit (the
	// buildkit image of make images: RootlessKit, buildkitd, runc).
	BuildContainer = "gdr-buildkit"
	// BuildSocketDir is where buildkitd's socket folder is mounted: in the
	// sidecar, writable; in the runner container, read-only.
	BuildSocketDir = "/run/buildkit"
	// EnvBuildKitHost names buildkitd's address for the job's steps (what
	// buildctl and `docker buildx create --driver remote` read).
	EnvBuildKitHost = "BUILDKIT_HOST"
	// BuildKitHost is its value: the sidecar's unix socket, reachable from
	// the Pod's containers that mount BuildSocketDir alone (no port).
	BuildKitHost = "unix://" + BuildSocketDir + "/buildkitd.sock"
	// DefaultBuildSeccompProfile is the sidecar's Localhost seccomp profile,
	// relative to the kubelet's seccomp folder: deploy/seccomp's file for
	// the node's architecture, installed there on every node of the pool.
	DefaultBuildSeccompProfile = "gdr/buildkit.json"
	// DefaultBuildCache bounds the sidecar's state (layers, build cache):
	// an emptyDir of the Pod, gone with it.
	DefaultBuildCache = "10Gi"
	// DefaultBuildMemory is the sidecar's memory limit, and its memory
	// request unless the pool sets one. RUN steps run in the sidecar's
	// cgroup, so this bounds a build; it is the shipped runner container's
	// limit. Request and limit are equal because memory cannot be taken
	// back: a sidecar using more than it requested is, under node memory
	// pressure, the first the kubelet evicts or the kernel kills, for
	// another Pod's use.
	DefaultBuildMemory = "4Gi"
	// DefaultBuildCPU is the sidecar's CPU limit: two cores for a build's
	// compilers, so one job's build cannot take a node's every core.
	DefaultBuildCPU = "2"
	// DefaultBuildCPURequest is the sidecar's CPU request unless the pool
	// sets one (at most its CPU limit). The request is held for the whole
	// job while BuildKit idles between builds, and CPU is throttled, never
	// killed: a request below the limit costs a build speed on a busy node,
	// never the build. With the shipped runner container's 500m, a build
	// Pod reserves 750m.
	DefaultBuildCPURequest = "250m"

	buildSocketVolume  = "gdr-buildkit-socket"
	buildStateVolume   = "gdr-buildkit-state"
	buildRuntimeVolume = "gdr-buildkit-tmp"
	// buildStateDir is buildkitd's --root in the buildkit image.
	buildStateDir = "/home/nonroot/.local/share/buildkit"
	// buildRuntimeDir is the sidecar's /tmp and XDG_RUNTIME_DIR:
	// RootlessKit's and runc's state, on a read-only root.
	buildRuntimeDir = "/tmp"
	// buildUser is the buildkit image's user, whose subordinate IDs
	// (/etc/subuid) RootlessKit maps.
	buildUser = 65532
)

// BuildKit is a pool's build capability: a rootless BuildKit beside each of its
// jobs, which the job's steps reach at BUILDKIT_HOST. Off unless set. In
// YAML (a pool's profile):
//
//	build:
//	  image: registry.example.com/gdr-buildkit:v1   # make images' buildkit
//	  seccompProfile: gdr/buildkit.json             # the default
//	  cacheSize: 10Gi                               # the default
//	  resources:                                    # the defaults
//	    requests: {cpu: 250m, memory: 4Gi}
//	    limits: {cpu: "2", memory: 4Gi}
//
// The sidecar runs as the image's user 65532 with every capability dropped
// but SETUID and SETGID (its newuidmap and newgidmap hold those as file
// capabilities, so privilege escalation is allowed in it alone), under the
// Localhost seccomp profile SeccompProfile (containerd's default plus the
// namespace system calls RootlessKit and runc need: internal/buildseccomp).
// It is never privileged. Its state, the build cache included, is an
// emptyDir of the Pod: no job sees another's cache. Its CPU and memory are
// always bounded (see BuildResources).
type BuildKit struct {
	// Image is the buildkit image (make images). Required.
	Image string `json:"image"`
	// SeccompProfile is the sidecar's Localhost profile, relative to the
	// kubelet's seccomp folder. Default DefaultBuildSeccompProfile.
	SeccompProfile string `json:"seccompProfile,omitempty"`
	// CacheSize bounds the sidecar's state (the emptyDir's sizeLimit).
	// Default DefaultBuildCache.
	CacheSize string `json:"cacheSize,omitempty"`
	// Resources are the sidecar's requests and limits; what it leaves out
	// is defaulted, never unset (see BuildResources).
	Resources BuildResources `json:"resources,omitempty"`

	// requirements are Resources with the defaults, set by validate.
	requirements corev1.ResourceRequirements
}

// BuildResources are a build sidecar's requests and limits, each a quantity
// by resource name as in a container's resources, kept as written so that
// an empty value is refused naming its field. After validation the sidecar
// always has a CPU and a memory limit and request: a resource the pool
// leaves out gets its default (limits.memory DefaultBuildMemory,
// limits.cpu DefaultBuildCPU, requests.memory the memory limit,
// requests.cpu DefaultBuildCPURequest or the CPU limit if lower); one it
// writes empty, null, zero or negative, or a request above its limit (the
// pool's or the default), is an error naming the field. A pool may set any
// other positive values, lower or higher, and other resources
// (ephemeral-storage) as Kubernetes takes them.
type BuildResources struct {
	Requests map[corev1.ResourceName]json.RawMessage `json:"requests,omitempty"`
	Limits   map[corev1.ResourceName]json.RawMessage `json:"limits,omitempty"`
}

// requirements returns r with the defaults, or an error naming the field at
// fault (see BuildResources).
func (r BuildResources) requirements() (corev1.ResourceRequirements, error) {
	requests, err := buildQuantities("requests", r.Requests)
	if err != nil {
		return corev1.ResourceRequirements{}, err
	}
	limits, err := buildQuantities("limits", r.Limits)
	if err != nil {
		return corev1.ResourceRequirements{}, err
	}
	defaulted := map[corev1.ResourceName]bool{}
	for name, q := range map[corev1.ResourceName]string{corev1.ResourceMemory: DefaultBuildMemory, corev1.ResourceCPU: DefaultBuildCPU} {
		if _, ok := limits[name]; !ok {
			limits[name], defaulted[name] = resource.MustParse(q), true
		}
	}
	if _, ok := requests[corev1.ResourceMemory]; !ok {
		requests[corev1.ResourceMemory] = limits[corev1.ResourceMemory]
	}
	if _, ok := requests[corev1.ResourceCPU]; !ok {
		cpu, limit := resource.MustParse(DefaultBuildCPURequest), limits[corev1.ResourceCPU]
		if limit.Cmp(cpu) < 0 {
			cpu = limit
		}
		requests[corev1.ResourceCPU] = cpu
	}
	for _, name := range slices.Sorted(maps.Keys(requests)) {
		q, l := requests[name], limits[name]
		if _, ok := limits[name]; !ok || q.Cmp(l) <= 0 {
			continue
		}
		if defaulted[name] {
			return corev1.ResourceRequirements{}, fmt.Errorf("resources.requests.%s: %s is above resources.limits.%s %s (the default); set resources.limits.%s too", name, q.String(), name, l.String(), name)
		}
		return corev1.ResourceRequirements{}, fmt.Errorf("resources.requests.%s: %s is above resources.limits.%s %s", name, q.String(), name, l.String())
	}
	return corev1.ResourceRequirements{Requests: requests, Limits: limits}, nil
}

// buildQuantities parses the quantities of resources.<kind>, each positive.
func buildQuantities(kind string, raw map[corev1.ResourceName]json.RawMessage) (corev1.ResourceList, error) {
	list := corev1.ResourceList{}
	for _, name := range slices.Sorted(maps.Keys(raw)) {
		text := raw[name]
		field := "resources." + kind + "." + string(name)
		if len(text) == 0 || string(text) == "null" {
			return nil, fmt.Errorf("%s: empty; %s", field, buildQuantityHint(kind, name))
		}
		var q resource.Quantity
		if err := json.Unmarshal(text, &q); err != nil {
			return nil, fmt.Errorf("%s: %s is not a quantity such as 4Gi or 500m: %w", field, text, err)
		}
		if q.Sign() <= 0 {
			return nil, fmt.Errorf("%s: %s is not positive; %s", field, q.String(), buildQuantityHint(kind, name))
		}
		list[name] = q
	}
	return list, nil
}

// buildQuantityHint says what to write in resources.<kind>.<name>.
func buildQuantityHint(kind string, name corev1.ResourceName) string {
	def := map[string]string{
		"limits." + string(corev1.ResourceMemory):   DefaultBuildMemory,
		"limits." + string(corev1.ResourceCPU):      DefaultBuildCPU,
		"requests." + string(corev1.ResourceMemory): "the memory limit",
		"requests." + string(corev1.ResourceCPU):    DefaultBuildCPURequest,
	}[kind+"."+string(name)]
	if def == "" {
		return "set a positive quantity or leave it out"
	}
	return "set a positive quantity (default " + def + ") or leave it out for the default"
}

// validate checks b and fills in its defaults.
func (b *BuildKit) validate() error {
	var err error
	if b.SeccompProfile, err = sidecarSettings("buildkit", b.Image, b.SeccompProfile, DefaultBuildSeccompProfile); err != nil {
		return err
	}
	if b.CacheSize, err = sidecarQuantity("cacheSize", b.CacheSize, DefaultBuildCache); err != nil {
		return err
	}
	if b.requirements, err = b.Resources.requirements(); err != nil {
		return err
	}
	return nil
}

// sidecarSettings checks a capability's image (required, the image of
// make images called kind) and Localhost seccomp profile, and returns the
// profile with its default def.
func sidecarSettings(kind, image, profile, def string) (string, error) {
	if image == "" {
		return "", fmt.Errorf("image: empty; name the %s image (make images)", kind)
	}
	profile = cmp.Or(profile, def)
	if path.IsAbs(profile) || path.Clean(profile) != profile || strings.HasPrefix(profile, "..") {
		return "", fmt.Errorf("seccompProfile %q: want a clean path relative to the kubelet's seccomp folder, such as %s", profile, def)
	}
	return profile, nil
}

// sidecarQuantity checks the size setting field (default def) and returns
// it with its default.
func sidecarQuantity(field, v, def string) (string, error) {
	v = cmp.Or(v, def)
	if q, err := resource.ParseQuantity(v); err != nil || q.Sign() <= 0 {
		return "", fmt.Errorf("%s %q: want a positive quantity such as %s", field, v, def)
	}
	return v, nil
}

// checkBuildReserved rejects a template that uses what injectBuild adds.
func checkBuildReserved(spec corev1.PodSpec) error {
	return checkSidecarReserved(spec, "build", BuildContainer, EnvBuildKitHost, BuildSocketDir)
}

// checkSidecarReserved rejects a template that uses what the capability
// (named by its profile field) adds: volume names with the prefix
// container, the container's name, the runner container's env and a mount
// overlapping socketDir.
func checkSidecarReserved(spec corev1.PodSpec, capability, container, env, socketDir string) error {
	for _, v := range spec.Volumes {
		if strings.HasPrefix(v.Name, container) {
			return fmt.Errorf("spec.volumes[%s]: the prefix %s is reserved for the %s capability", v.Name, container, capability)
		}
	}
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for _, c := range list {
			if c.Name == container {
				return fmt.Errorf("spec: container name %q is reserved for the %s capability", container, capability)
			}
		}
	}
	c := spec.Containers[runnerIndex(spec.Containers)]
	for _, e := range c.Env {
		if e.Name == env {
			return fmt.Errorf("spec.containers[%s].env: %s is set by the %s capability (profile %s)", RunnerContainer, env, capability, capability)
		}
	}
	for _, m := range c.VolumeMounts {
		if overlaps(m.MountPath, socketDir) {
			return fmt.Errorf("spec.containers[%s].volumeMounts[%s]: mountPath %s overlaps the %s capability's %s", RunnerContainer, m.Name, m.MountPath, capability, socketDir)
		}
	}
	return nil
}

// sidecarSecurity is a capability sidecar's security context: the image's
// user, every capability dropped but SETUID and SETGID, privilege
// escalation allowed for its ID-mapping helpers' file capabilities alone,
// never privileged, a read-only root, the Localhost seccomp profile.
func sidecarSecurity(user int64, profile string) *corev1.SecurityContext {
	no, yes := false, true
	return &corev1.SecurityContext{
		RunAsUser:                &user,
		RunAsGroup:               &user,
		RunAsNonRoot:             &yes,
		Privileged:               &no,
		AllowPrivilegeEscalation: &yes, // newuidmap's and newgidmap's file capabilities
		ReadOnlyRootFilesystem:   &yes,
		Capabilities: &corev1.Capabilities{
			Drop: []corev1.Capability{"ALL"},
			Add:  []corev1.Capability{"SETUID", "SETGID"},
		},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &profile},
	}
}

// injectBuild adds b, validated, to a validated template: the sidecar
// BuildContainer (see BuildKit), bounded by b's resources with their
// defaults, with its three emptyDirs (socket, state, runtime), and in the
// runner container the socket folder read-only at BuildSocketDir and
// BUILDKIT_HOST. The sidecar pulls its image as the runner container does;
// a startup probe holds the runner back until buildkitd answers, so the
// first step can build.
func injectBuild(t *corev1.PodTemplateSpec, b BuildKit) {
	spec := &t.Spec
	runner := &spec.Containers[runnerIndex(spec.Containers)]
	cache := resource.MustParse(b.CacheSize)
	small := resource.MustParse("64Mi")
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: buildSocketVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &small}}},
		corev1.Volume{Name: buildStateVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &cache}}},
		corev1.Volume{Name: buildRuntimeVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &small}}})
	always := corev1.ContainerRestartPolicyAlways
	spec.InitContainers = append(spec.InitContainers, corev1.Container{
		Name:            BuildContainer,
		Image:           b.Image,
		ImagePullPolicy: runner.ImagePullPolicy,
		RestartPolicy:   &always,
		Resources:       b.requirements,
		Env:             []corev1.EnvVar{{Name: "XDG_RUNTIME_DIR", Value: buildRuntimeDir}},
		VolumeMounts: []corev1.VolumeMount{
			{Name: buildSocketVolume, MountPath: BuildSocketDir},
			{Name: buildStateVolume, MountPath: buildStateDir},
			{Name: buildRuntimeVolume, MountPath: buildRuntimeDir},
		},
		StartupProbe: &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
				Command: []string{"buildctl", "--addr", BuildKitHost, "debug", "workers"},
			}},
			PeriodSeconds: 1, TimeoutSeconds: 5, FailureThreshold: 120,
		},
		SecurityContext:          sidecarSecurity(buildUser, b.SeccompProfile),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	})
	runner.VolumeMounts = append(runner.VolumeMounts, corev1.VolumeMount{Name: buildSocketVolume, MountPath: BuildSocketDir, ReadOnly: true})
	runner.Env = append(runner.Env, corev1.EnvVar{Name: EnvBuildKitHost, Value: BuildKitHost})
}
