package pod

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// What the backend adds to every pool's pod template (see inject). The names
// and paths are reserved: a template that uses them is rejected.
const (
	// InstallContainer is the init container that copies the static runner
	// into the runner volume: it runs the runner image's entrypoint (the
	// runner) with `install RunnerPath`.
	InstallContainer = "gdr-install-runner"
	// RunnerDir is where the runner volume (an emptyDir) is mounted, writable
	// in InstallContainer and read-only in the runner container.
	RunnerDir = "/gdr/bin"
	// RunnerPath is the runner's path in RunnerDir: the runner container's
	// command, whatever its image.
	RunnerPath = RunnerDir + "/runner"
	// WorkloadAPIDir is where the directory holding the SPIFFE Workload API
	// socket is mounted, read-only, in the runner container.
	WorkloadAPIDir = "/spiffe-workload-api"
	// EnvWorkloadAPISocket is the runner's (go-spiffe's) variable naming the
	// Workload API socket; the runner reads it, then removes it from the
	// environment its steps see.
	EnvWorkloadAPISocket = "SPIFFE_ENDPOINT_SOCKET"

	// DefaultCSIDriver is the SPIFFE CSI driver's name.
	DefaultCSIDriver = "csi.spiffe.io"
	// DefaultAgentSocket is the SPIRE agent's socket file name in the
	// directory the CSI driver (or the hostPath) provides.
	DefaultAgentSocket = "spire-agent.sock"

	runnerVolume      = "gdr-runner"
	workloadAPIVolume = "gdr-spiffe-workload-api"
	// installUser is the user of the runner image (make images); the init
	// container runs as it unless the template names a non-root user.
	installUser = 65532
)

// runnerVolumeSize bounds the runner volume: the static runner and the
// temporary file it is written through.
func runnerVolumeSize() *resource.Quantity {
	q := resource.MustParse("256Mi")
	return &q
}

// installResources are the init container's: it copies one file. Its memory
// limit leaves room for the page cache of the copy; the Pod's effective
// request is the larger of it and its containers', so it costs no capacity.
func installResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("10m"),
			corev1.ResourceMemory: resource.MustParse("32Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("128Mi"),
		},
	}
}

// WorkloadAPI says how the runner container reaches the SPIRE agent's
// Workload API. At most one of CSIDriver and HostPath is set; with neither,
// the SPIFFE CSI driver DefaultCSIDriver is used. In YAML (a pool's profile):
//
//	workloadAPI:
//	  hostPath: /run/spire/agent-sockets   # instead of the CSI driver
//	  socket: spire-agent.sock
type WorkloadAPI struct {
	// CSIDriver is the name of the SPIFFE CSI driver whose read-only inline
	// volume holds the agent's socket. Default DefaultCSIDriver.
	CSIDriver string `json:"csiDriver,omitempty"`
	// HostPath is the node's directory holding the agent's socket, mounted
	// read-only (type Directory: the Pod does not start without it). Pod
	// Security's baseline and restricted levels forbid hostPath volumes; use
	// it only where the CSI driver cannot be installed.
	HostPath string `json:"hostPath,omitempty"`
	// Socket is the socket's file name in that directory. Default
	// DefaultAgentSocket.
	Socket string `json:"socket,omitempty"`
}

// validate checks w and fills in its defaults.
func (w *WorkloadAPI) validate() error {
	switch {
	case w.CSIDriver != "" && w.HostPath != "":
		return errors.New("csiDriver and hostPath are both set; set one")
	case w.HostPath != "":
		if !path.IsAbs(w.HostPath) || path.Clean(w.HostPath) != w.HostPath {
			return fmt.Errorf("hostPath %q: want a clean absolute path", w.HostPath)
		}
	default:
		if w.CSIDriver == "" {
			w.CSIDriver = DefaultCSIDriver
		}
		if errs := validation.IsDNS1123Subdomain(w.CSIDriver); len(errs) > 0 {
			return fmt.Errorf("csiDriver %q: %s", w.CSIDriver, strings.Join(errs, "; "))
		}
	}
	if w.Socket == "" {
		w.Socket = DefaultAgentSocket
	}
	if strings.Contains(w.Socket, "/") || w.Socket == "." || w.Socket == ".." {
		return fmt.Errorf("socket %q: want a file name", w.Socket)
	}
	return nil
}

// volume is the Pod volume holding the agent's socket.
func (w WorkloadAPI) volume() corev1.Volume {
	v := corev1.Volume{Name: workloadAPIVolume}
	if w.HostPath != "" {
		dir := corev1.HostPathDirectory
		v.HostPath = &corev1.HostPathVolumeSource{Path: w.HostPath, Type: &dir}
	} else {
		readOnly := true
		v.CSI = &corev1.CSIVolumeSource{Driver: w.CSIDriver, ReadOnly: &readOnly}
	}
	return v
}

// SocketAddress is the value of EnvWorkloadAPISocket in the runner container.
func (w WorkloadAPI) SocketAddress() string {
	return "unix://" + path.Join(WorkloadAPIDir, w.Socket)
}

// checkReserved rejects a template that uses what inject adds. The error
// starts with the offending field.
func checkReserved(spec corev1.PodSpec) error {
	for _, v := range spec.Volumes {
		if v.Name == runnerVolume || v.Name == workloadAPIVolume {
			return fmt.Errorf("spec.volumes[%s]: the name is reserved for the backend's volumes", v.Name)
		}
		if strings.HasPrefix(v.Name, ServiceContainerPrefix) {
			return fmt.Errorf("spec.volumes[%s]: the prefix %q is reserved for the job's services", v.Name, ServiceContainerPrefix)
		}
	}
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		if slices.ContainsFunc(list, func(c corev1.Container) bool { return c.Name == InstallContainer }) {
			return fmt.Errorf("spec: container name %q is reserved for the backend's init container", InstallContainer)
		}
		for _, c := range list {
			if strings.HasPrefix(c.Name, ServiceContainerPrefix) {
				return fmt.Errorf("spec: container name %q: the prefix %q is reserved for the job's services", c.Name, ServiceContainerPrefix)
			}
		}
	}
	c := spec.Containers[runnerIndex(spec.Containers)]
	at := "spec.containers[" + RunnerContainer + "]"
	if len(c.Command) > 0 || len(c.Args) > 0 {
		return fmt.Errorf("%s.command, args: set by the backend, which runs the injected runner %s; leave them empty", at, RunnerPath)
	}
	for _, e := range c.Env {
		if e.Name == EnvWorkloadAPISocket {
			return fmt.Errorf("%s.env: %s is set by the backend (profile workloadAPI)", at, EnvWorkloadAPISocket)
		}
	}
	for _, m := range c.VolumeMounts {
		for _, reserved := range []string{RunnerDir, WorkloadAPIDir} {
			if overlaps(m.MountPath, reserved) {
				return fmt.Errorf("%s.volumeMounts[%s]: mountPath %s overlaps the backend's %s", at, m.Name, m.MountPath, reserved)
			}
		}
	}
	return nil
}

// overlaps reports whether one of two absolute paths is the other or under it.
func overlaps(a, b string) bool {
	under := func(p, dir string) bool { return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/") }
	a, b = path.Clean(a), path.Clean(b)
	return under(a, b) || under(b, a)
}

// inject adds to a validated template (see checkReserved) what lets any
// image run the runner and get its SVID:
//
//   - an emptyDir (runnerVolume) and the init container InstallContainer,
//     image runnerImage, which runs that image's entrypoint (the static
//     runner) with `install RunnerPath`: hardened (non-root, read-only root
//     filesystem, no privilege escalation, no capabilities, RuntimeDefault
//     seccomp) and small;
//   - in the runner container: command RunnerPath and the runner volume
//     read-only at RunnerDir; with w (nil when the SVID comes minted, in the
//     Secret), also the Workload API volume read-only at WorkloadAPIDir and
//     EnvWorkloadAPISocket naming its socket.
//
// The runner container's own hardening is the template's and is left as is.
// The job's image (container:) replaces only the runner container's image,
// so it needs nothing of ours. See injectDirect for an image that holds the
// runner.
func inject(t *corev1.PodTemplateSpec, runnerImage string, w *WorkloadAPI) {
	spec := &t.Spec
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: runnerVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: runnerVolumeSize()}}})
	spec.InitContainers = append(spec.InitContainers, installContainer(spec, runnerImage))
	c := &spec.Containers[runnerIndex(spec.Containers)]
	c.Command, c.Args = []string{RunnerPath}, nil
	c.VolumeMounts = append(c.VolumeMounts,
		corev1.VolumeMount{Name: runnerVolume, MountPath: RunnerDir, ReadOnly: true})
	injectWorkloadAPI(spec, c, w)
}

// injectDirect is inject for a runner container whose image holds the
// runner at runnerPath (Profile.RunnerInImage): its command is that path,
// and there is no install init container and no runner volume.
func injectDirect(t *corev1.PodTemplateSpec, runnerPath string, w *WorkloadAPI) {
	spec := &t.Spec
	c := &spec.Containers[runnerIndex(spec.Containers)]
	c.Command, c.Args = []string{runnerPath}, nil
	injectWorkloadAPI(spec, c, w)
}

// injectWorkloadAPI adds w's volume to spec, read-only at WorkloadAPIDir in
// the runner container c with EnvWorkloadAPISocket naming its socket; with
// no w, nothing.
func injectWorkloadAPI(spec *corev1.PodSpec, c *corev1.Container, w *WorkloadAPI) {
	if w == nil {
		return
	}
	spec.Volumes = append(spec.Volumes, w.volume())
	c.VolumeMounts = append(c.VolumeMounts,
		corev1.VolumeMount{Name: workloadAPIVolume, MountPath: WorkloadAPIDir, ReadOnly: true})
	c.Env = append(c.Env, corev1.EnvVar{Name: EnvWorkloadAPISocket, Value: w.SocketAddress()})
}

// installContainer is the init container of inject. It runs as the runner
// container's (or the Pod's) user and group when they are set and not root,
// else as the runner image's installUser, and pulls its image as the runner
// container's says (imagePullPolicy: a cluster whose nodes hold the images
// beforehand sets IfNotPresent or Never there, for both).
func installContainer(spec *corev1.PodSpec, image string) corev1.Container {
	runner := spec.Containers[runnerIndex(spec.Containers)]
	var podSC corev1.PodSecurityContext
	if spec.SecurityContext != nil {
		podSC = *spec.SecurityContext
	}
	var runnerSC corev1.SecurityContext
	if runner.SecurityContext != nil {
		runnerSC = *runner.SecurityContext
	}
	id := func(container, pod *int64) *int64 {
		v := int64(installUser)
		for _, p := range []*int64{container, pod} {
			if p != nil {
				if *p != 0 {
					v = *p
				}
				break
			}
		}
		return &v
	}
	no, yes := false, true
	return corev1.Container{
		Name:            InstallContainer,
		Image:           image,
		ImagePullPolicy: runner.ImagePullPolicy,
		// The image's entrypoint is the runner: `runner install <path>`
		// copies itself (mode 0755, renamed into place).
		Args:         []string{"install", RunnerPath},
		Resources:    installResources(),
		VolumeMounts: []corev1.VolumeMount{{Name: runnerVolume, MountPath: RunnerDir}},
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             &yes,
			RunAsUser:                id(runnerSC.RunAsUser, podSC.RunAsUser),
			RunAsGroup:               id(runnerSC.RunAsGroup, podSC.RunAsGroup),
			AllowPrivilegeEscalation: &no,
			Privileged:               &no,
			ReadOnlyRootFilesystem:   &yes,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}
