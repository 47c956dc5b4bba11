package pod

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// What a pool's docker capability (Profile.Docker, a rootless Docker daemon)
// adds to its Pods. The names and the socket folder are reserved in every
// template.
const (
	// DockerContainer is the native sidecar running rootless Docker (the
	// docker image of make images: dockerd under RootlessKit and
	// slirp4netns, its entrypoint gdr-dockerd).
	DockerContainer = "gdr-docker"
	// DockerSocketDir is where dockerd's socket folder is mounted: in the
	// sidecar, writable; in the runner container, read-only.
	DockerSocketDir = "/run/docker-socket"
	// EnvDockerHost names the daemon's address for the job's steps (what
	// the docker CLI and act read).
	EnvDockerHost = "DOCKER_HOST"
	// DockerHost is its value: the sidecar's unix socket.
	DockerHost = "unix://" + DockerSocketDir + "/docker.sock"
	// DefaultDockerSeccompProfile is the sidecar's Localhost seccomp
	// profile: the build sidecar's (the same exception: the namespace
	// system calls RootlessKit and runc need, internal/buildseccomp).
	DefaultDockerSeccompProfile = DefaultBuildSeccompProfile
	// DefaultDockerStorage bounds the daemon's data root (images, layers,
	// containers, volumes): an emptyDir of the Pod, gone with it.
	DefaultDockerStorage = "20Gi"
	// TunDevice is the node's TUN/TAP device, which slirp4netns opens to
	// give the daemon a network namespace of its own whose traffic leaves
	// as the Pod's (a CharDevice hostPath volume of the sidecar alone).
	TunDevice = "/dev/net/tun"

	dockerSocketVolume  = "gdr-docker-socket"
	dockerStateVolume   = "gdr-docker-state"
	dockerRuntimeVolume = "gdr-docker-run"
	dockerTunVolume     = "gdr-docker-tun"
	// dockerStateDir holds gdr-dockerd's data root in the docker image.
	dockerStateDir = "/home/nonroot/.local/share/docker"
	// dockerRuntimeDir is the sidecar's XDG_RUNTIME_DIR: RootlessKit's,
	// containerd's and dockerd's state, on a read-only root, apart from
	// the job's /tmp.
	dockerRuntimeDir = "/home/nonroot/.run"
	// dockerUser is the docker image's user, whose subordinate IDs
	// (/etc/subuid) RootlessKit maps.
	dockerUser = 65532
	// DockerIDsPerPod is the kubelet's userNamespaces.idsPerPod a node
	// needs for a pool with Docker.UserNamespace: the docker image's
	// subordinate IDs (100000-165535) inside the Pod's. A power of two, so
	// that the kubelet's default range of IDs holds a whole number of Pods
	// (3 * 65536 would need the kubelet user's subordinate IDs configured).
	DockerIDsPerPod = 4 * 65536
	// EnvDockerUserNamespace tells gdr-dockerd the Pod has a user
	// namespace and the sidecar an unmasked /proc ("true").
	EnvDockerUserNamespace = "GDR_DOCKER_USER_NAMESPACE"
	// RunnerWorkDir is the runner's GDR_WORK_DIR default (shared/runner's
	// Config.WorkDir; its TestPodKnowsTheWorkDir keeps the two in step).
	RunnerWorkDir = "/tmp/gitea-dynamic-runner"
)

// Docker is a pool's docker capability: a rootless Docker daemon beside
// each of its jobs, which the job's steps reach at DOCKER_HOST (`docker
// build`, `docker run`, `docker compose`). Off unless set. In YAML (a pool's
// profile):
//
//	docker:
//	  image: registry.example.com/gdr-docker:v1   # make images' docker
//	  seccompProfile: gdr/buildkit.json           # the default
//	  storageSize: 20Gi                           # the default
//	  resources:                                  # the defaults (as build's)
//	    requests: {cpu: 250m, memory: 4Gi}
//	    limits: {cpu: "2", memory: 4Gi}
//
// The sidecar runs as the image's user 65532 with every capability dropped
// but SETUID and SETGID (newuidmap's and newgidmap's file capabilities, so
// privilege escalation is allowed in it alone), under the Localhost seccomp
// profile SeccompProfile; it is never privileged. It mounts the node's
// TunDevice (slirp4netns makes the daemon's tap device with it, in the
// daemon's own network namespace: the Pod's is untouched, and every
// connection a container makes leaves through slirp4netns's sockets as
// the Pod's, under the Pod's NetworkPolicy). Its data root is an emptyDir
// of the Pod: no job sees another's images. It mounts the volume that holds
// the runner's work folder at the same path, so that `docker run -v
// $PWD:/src` sees the job's workspace. Its CPU and memory are always
// bounded (BuildResources, with build's defaults).
type Docker struct {
	// Image is the docker image (make images). Required.
	Image string `json:"image"`
	// SeccompProfile is the sidecar's Localhost profile, relative to the
	// kubelet's seccomp folder. Default DefaultDockerSeccompProfile.
	SeccompProfile string `json:"seccompProfile,omitempty"`
	// StorageSize bounds the daemon's data root (the emptyDir's
	// sizeLimit). Default DefaultDockerStorage.
	StorageSize string `json:"storageSize,omitempty"`
	// Resources are the sidecar's requests and limits; what it leaves out
	// is defaulted, never unset (see BuildResources).
	Resources BuildResources `json:"resources,omitempty"`
	// UserNamespace runs the pool's Pods in Kubernetes user namespaces
	// (hostUsers: false) and gives the sidecar an unmasked /proc
	// (procMount: Unmasked, which the kernel's checks need for a new procfs
	// and a writable /proc/sys in the daemon's own namespaces), so that RUN
	// in `docker build`, bridge networks and `docker compose` work. Every
	// ID of the Pod, root included, is then an unprivileged ID of the node.
	// The nodes need user namespaces (Kubernetes 1.33 or later with
	// containerd 2 or CRI-O 1.25, runc 1.2 or crun 1.9, Linux 6.3 or later)
	// and DockerIDsPerPod IDs per Pod (the kubelet's userNamespaces.idsPerPod),
	// which hold the image's subordinate IDs 100000-165535. Default false.
	UserNamespace bool `json:"userNamespace,omitempty"`

	// requirements are Resources with the defaults, set by validate.
	requirements corev1.ResourceRequirements
}

// validate checks d and fills in its defaults.
func (d *Docker) validate() error {
	var err error
	if d.SeccompProfile, err = sidecarSettings("docker", d.Image, d.SeccompProfile, DefaultDockerSeccompProfile); err != nil {
		return err
	}
	if d.StorageSize, err = sidecarQuantity("storageSize", d.StorageSize, DefaultDockerStorage); err != nil {
		return err
	}
	if d.requirements, err = d.Resources.requirements(); err != nil {
		return err
	}
	return nil
}

// checkDockerReserved rejects a template that uses what injectDocker adds.
func checkDockerReserved(spec corev1.PodSpec) error {
	return checkSidecarReserved(spec, "docker", DockerContainer, EnvDockerHost, DockerSocketDir)
}

// workMount returns the runner container's volume mount that holds its
// work folder (GDR_WORK_DIR, else the runner's default): the deepest whose
// path contains it.
func workMount(c corev1.Container) (corev1.VolumeMount, error) {
	dir := RunnerWorkDir
	for _, e := range c.Env {
		if e.Name == "GDR_WORK_DIR" && e.Value != "" {
			dir = path.Clean(e.Value)
		}
	}
	var found *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		p := path.Clean(m.MountPath)
		if (dir == p || strings.HasPrefix(dir, p+"/") || p == "/") && (found == nil || len(p) > len(path.Clean(found.MountPath))) {
			found = &c.VolumeMounts[i]
		}
	}
	if found == nil || found.ReadOnly {
		return corev1.VolumeMount{}, fmt.Errorf("the runner container's work folder %s is on no writable volume: the docker capability mounts that volume in its daemon, so that containers see the job's files at their paths; mount one (the shipped template mounts the emptyDir tmp at /tmp)", dir)
	}
	return *found, nil
}

// injectDocker adds d, validated, to a validated template: the sidecar
// DockerContainer (see Docker), bounded by d's resources with their
// defaults, with its emptyDirs (socket, state, runtime), the node's
// TunDevice and the runner container's work volume (work) at the same
// path; and in the runner container the socket folder read-only at
// DockerSocketDir and DOCKER_HOST. A startup probe holds the runner back
// until dockerd answers, so the first step can use it.
func injectDocker(t *corev1.PodTemplateSpec, d Docker, work corev1.VolumeMount) {
	spec := &t.Spec
	runner := &spec.Containers[runnerIndex(spec.Containers)]
	storage := resource.MustParse(d.StorageSize)
	small := resource.MustParse("64Mi")
	runtime := resource.MustParse("256Mi")
	charDev := corev1.HostPathCharDev
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: dockerSocketVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &small}}},
		corev1.Volume{Name: dockerStateVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &storage}}},
		corev1.Volume{Name: dockerRuntimeVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &runtime}}},
		corev1.Volume{Name: dockerTunVolume, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: TunDevice, Type: &charDev}}})
	always := corev1.ContainerRestartPolicyAlways
	spec.InitContainers = append(spec.InitContainers, corev1.Container{
		Name:            DockerContainer,
		Image:           d.Image,
		ImagePullPolicy: runner.ImagePullPolicy,
		RestartPolicy:   &always,
		Resources:       d.requirements,
		Env: []corev1.EnvVar{{Name: "XDG_RUNTIME_DIR", Value: dockerRuntimeDir}, {Name: "DOCKER_SOCKET_DIR", Value: DockerSocketDir},
			{Name: EnvDockerUserNamespace, Value: strconv.FormatBool(d.UserNamespace)}},
		VolumeMounts: []corev1.VolumeMount{
			{Name: dockerSocketVolume, MountPath: DockerSocketDir},
			{Name: dockerStateVolume, MountPath: dockerStateDir},
			{Name: dockerRuntimeVolume, MountPath: dockerRuntimeDir},
			{Name: dockerTunVolume, MountPath: TunDevice, ReadOnly: true}, // a device opens read-write on a read-only mount
			{Name: work.Name, MountPath: work.MountPath, SubPath: work.SubPath, SubPathExpr: work.SubPathExpr},
		},
		StartupProbe: &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
				Command: []string{"docker", "--host", DockerHost, "version"},
			}},
			PeriodSeconds: 1, TimeoutSeconds: 5, FailureThreshold: 120,
		},
		SecurityContext:          sidecarSecurity(dockerUser, d.SeccompProfile),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	})
	if d.UserNamespace {
		hostUsers, unmasked := false, corev1.UnmaskedProcMount
		spec.HostUsers = &hostUsers
		spec.InitContainers[len(spec.InitContainers)-1].SecurityContext.ProcMount = &unmasked
	}
	runner.VolumeMounts = append(runner.VolumeMounts, corev1.VolumeMount{Name: dockerSocketVolume, MountPath: DockerSocketDir, ReadOnly: true})
	runner.Env = append(runner.Env, corev1.EnvVar{Name: EnvDockerHost, Value: DockerHost})
}

// checkDockerUserNamespace rejects a template that keeps the Pod in the
// node's user namespace (hostUsers: true) for a pool whose docker wants
// one of its own.
func checkDockerUserNamespace(spec corev1.PodSpec, d Docker) error {
	if d.UserNamespace && spec.HostUsers != nil && *spec.HostUsers {
		return fmt.Errorf("userNamespace: the podTemplate sets hostUsers: true; the docker capability's user namespace needs it false or unset")
	}
	return nil
}
