package pod

import (
	"fmt"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	units "github.com/docker/go-units"
	"github.com/kballard/go-shellquote"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
)

// ServiceContainerPrefix prefixes the name of the sidecar of each of a job's
// `services:` (ServiceContainerPrefix + the service's key). The prefix is
// reserved: a template container that uses it is rejected.
const ServiceContainerPrefix = "gdr-service-"

// DefaultServiceTimeout is how long the runner waits for the services' ports
// when the profile sets no serviceTimeout.
const DefaultServiceTimeout = jobservices.DefaultReadyTimeout

// supportedOptions are the `options:` a service may use, as the error that
// refuses another one lists them.
const supportedOptions = "--user, --cpus, --memory, --entrypoint, --health-cmd, --health-interval, --health-timeout, --health-retries, --health-start-period, --no-healthcheck"

// Docker's health check defaults, which a --health-cmd without the other
// flags gets.
const (
	dockerHealthInterval = 30 * time.Second
	dockerHealthTimeout  = 30 * time.Second
	dockerHealthRetries  = 3
)

// serviceSpec is what the options of one service map onto.
type serviceSpec struct {
	user, group  *int64
	limits       corev1.ResourceList
	entrypoint   string
	healthCmd    string
	interval     time.Duration
	timeout      time.Duration
	retries      int32
	startPeriod  time.Duration
	healthParams bool // a --health-* flag other than --health-cmd was given
}

// DefaultServiceMemory is the memory request and limit of a service that
// sets no --memory, when the pool's profile sets no serviceMemory.
const DefaultServiceMemory = "512Mi"

// serviceTmpDir is where every sidecar gets a writable, empty /tmp (its root
// filesystem is read-only).
const serviceTmpDir = "/tmp"

// sidecars returns a job's services as native sidecars of the executor Pod
// (init containers with restartPolicy Always, started in order after the
// template's init containers and the runner's install, and before the
// runner container), the volumes they mount and the host alias that makes
// each service's key resolve to the Pod itself. Every value comes from the
// signed assignment; memory is the request and limit of a service without
// --memory.
//
// Every sidecar is hardened like the template's containers: non-root, no
// privilege escalation, every capability dropped, RuntimeDefault seccomp, a
// read-only root filesystem, and a memory request and limit. What it may
// write is one emptyDir of its own (named after its container): /tmp, and
// each anonymous volume the service declares (`volumes: [/var/lib/data]`,
// Docker's syntax for a fresh volume at a path), as sub-paths of it.
//
// Errors name the service and the field or option that cannot be run: they
// are permanent, as the same job never runs.
func sidecars(services []jobservices.Service, memory resource.Quantity) ([]corev1.Container, []corev1.Volume, *corev1.HostAlias, error) {
	if len(services) == 0 {
		return nil, nil, nil, nil
	}
	var (
		out     []corev1.Container
		volumes []corev1.Volume
		alias   = &corev1.HostAlias{IP: "127.0.0.1"}
		taken   = map[jobservices.Port]string{}
	)
	for _, s := range services {
		c, err := sidecar(s, memory)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("service %s: %w", s.ID, err)
		}
		for _, p := range c.Ports {
			if other, ok := taken[jobservices.Port(p.ContainerPort)]; ok {
				return nil, nil, nil, fmt.Errorf("services %s and %s both declare port %d: they share the executor's network namespace", other, s.ID, p.ContainerPort)
			}
			taken[jobservices.Port(p.ContainerPort)] = s.ID
		}
		out = append(out, c)
		volumes = append(volumes, corev1.Volume{Name: c.Name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		alias.Hostnames = append(alias.Hostnames, s.ID)
	}
	return out, volumes, alias, nil
}

// writableMounts are a sidecar's mounts of its own emptyDir (named after
// the container): /tmp, and one sub-path per anonymous volume. A volume with
// a source (a named volume or a host path) is refused: a service has neither.
func writableMounts(container string, volumes []string) ([]corev1.VolumeMount, error) {
	mounts := []corev1.VolumeMount{{Name: container, MountPath: serviceTmpDir, SubPath: "tmp"}}
	for i, v := range volumes {
		if jobservices.HasExpression(v) {
			return nil, exprError("volumes")
		}
		if strings.Contains(v, ":") || !path.IsAbs(v) {
			return nil, fmt.Errorf("volumes: %q: only anonymous volumes (an absolute path inside the container, such as /var/lib/data) are supported: a service runs as a sidecar of the executor Pod, with no host paths or Docker volumes", v)
		}
		p := path.Clean(v)
		if p == "/" {
			return nil, fmt.Errorf("volumes: %q: a volume cannot be the root directory", v)
		}
		for _, m := range mounts {
			if m.MountPath == p {
				return nil, fmt.Errorf("volumes: %q is mounted twice (/tmp is always a volume of its own)", v)
			}
		}
		mounts = append(mounts, corev1.VolumeMount{Name: container, MountPath: p, SubPath: fmt.Sprintf("volume-%d", i)})
	}
	return mounts, nil
}

func sidecar(s jobservices.Service, memory resource.Quantity) (corev1.Container, error) {
	if errs := validation.IsDNS1123Label(ServiceContainerPrefix + s.ID); len(errs) > 0 || strings.Contains(s.ID, ".") {
		return corev1.Container{}, fmt.Errorf("the key must be a DNS label of at most %d characters (lower-case letters, digits, inner '-'): it is the service's hostname and names its container",
			validation.DNS1123LabelMaxLength-len(ServiceContainerPrefix))
	}
	mounts, err := writableMounts(ServiceContainerPrefix+s.ID, s.Volumes)
	if err != nil {
		return corev1.Container{}, err
	}
	switch {
	case s.Credentials:
		return corev1.Container{}, fmt.Errorf("credentials are not supported: images are pulled with the runner pool's imagePullSecrets")
	case jobservices.HasExpression(s.Image):
		return corev1.Container{}, exprError("image")
	}
	for _, p := range s.Ports {
		if jobservices.HasExpression(p) {
			return corev1.Container{}, exprError("ports")
		}
	}
	ports, err := jobservices.ParsePorts(s.Ports)
	if err != nil {
		return corev1.Container{}, err
	}
	opt, err := parseOptions(s.Options)
	if err != nil {
		return corev1.Container{}, err
	}
	if _, ok := opt.limits[corev1.ResourceMemory]; !ok {
		opt.limit(corev1.ResourceMemory, memory)
	}
	always, no, yes := corev1.ContainerRestartPolicyAlways, false, true
	c := corev1.Container{
		Name:          ServiceContainerPrefix + s.ID,
		Image:         s.Image,
		RestartPolicy: &always,
		Args:          slices.Clone(s.Cmd),
		Resources: corev1.ResourceRequirements{
			Limits:   opt.limits,
			Requests: corev1.ResourceList{corev1.ResourceMemory: opt.limits[corev1.ResourceMemory]},
		},
		VolumeMounts: mounts,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             &yes,
			RunAsUser:                opt.user,
			RunAsGroup:               opt.group,
			AllowPrivilegeEscalation: &no,
			Privileged:               &no,
			ReadOnlyRootFilesystem:   &yes,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	for _, a := range s.Cmd {
		if jobservices.HasExpression(a) {
			return corev1.Container{}, exprError("cmd")
		}
	}
	if opt.entrypoint != "" {
		c.Command = []string{opt.entrypoint}
	}
	names := make([]string, 0, len(s.Env))
	for k := range s.Env {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if jobservices.HasExpression(s.Env[k]) {
			return corev1.Container{}, exprError("env " + k)
		}
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: s.Env[k]})
	}
	for _, p := range ports {
		c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: int32(p), Protocol: corev1.ProtocolTCP})
	}
	if opt.healthCmd != "" {
		c.StartupProbe = opt.probe()
	} else if opt.healthParams {
		return corev1.Container{}, fmt.Errorf("options: --health-interval, --health-timeout, --health-retries and --health-start-period need --health-cmd")
	}
	return c, nil
}

// exprError refuses a `${{ }}` expression in a service's field. The value
// is not quoted (it may name a secret).
func exprError(field string) error {
	return fmt.Errorf("%s holds a ${{ }} expression, which the pod backend cannot evaluate: it builds the service before the job runs, from the signed assignment, and never puts a secret into a Pod spec; write the value literally", field)
}

// parseOptions maps a service's `options:` (docker create flags) onto a
// sidecar. A flag outside supportedOptions is an error naming it.
func parseOptions(options string) (serviceSpec, error) {
	var spec serviceSpec
	if jobservices.HasExpression(options) {
		return spec, exprError("options")
	}
	args, err := shellquote.Split(options)
	if err != nil {
		return spec, fmt.Errorf("options: %w", err)
	}
	for i := 0; i < len(args); i++ {
		flag, value, hasValue := strings.Cut(args[i], "=")
		if !strings.HasPrefix(flag, "-") {
			return spec, fmt.Errorf("options: %q is not a flag", args[i])
		}
		if flag == "--no-healthcheck" && !hasValue {
			continue // images' HEALTHCHECKs are never run in a Pod anyway
		}
		takesValue := false
		switch flag {
		case "--user", "-u", "--cpus", "--memory", "-m", "--entrypoint",
			"--health-cmd", "--health-interval", "--health-timeout", "--health-retries", "--health-start-period":
			takesValue = true
		}
		if !takesValue {
			return spec, fmt.Errorf("option %s cannot run in a Pod sidecar (supported: %s)", flag, supportedOptions)
		}
		if !hasValue {
			if i+1 >= len(args) {
				return spec, fmt.Errorf("option %s: no value", flag)
			}
			i++
			value = args[i]
		}
		if err := spec.set(flag, value); err != nil {
			return spec, fmt.Errorf("option %s: %w", flag, err)
		}
	}
	return spec, nil
}

func (s *serviceSpec) set(flag, value string) error {
	switch flag {
	case "--user", "-u":
		u, g, hasGroup := strings.Cut(value, ":")
		uid, err := strconv.ParseInt(u, 10, 64)
		if err != nil || uid < 0 || uid > math.MaxInt32 {
			return fmt.Errorf("%q: want a numeric user ID (uid or uid:gid): kubelet cannot look names up in the image", value)
		}
		if uid == 0 {
			return fmt.Errorf("services do not run as root")
		}
		s.user = &uid
		if hasGroup {
			gid, err := strconv.ParseInt(g, 10, 64)
			if err != nil || gid < 0 || gid > math.MaxInt32 {
				return fmt.Errorf("%q: want a numeric group ID", value)
			}
			s.group = &gid
		}
	case "--cpus":
		f, err := strconv.ParseFloat(value, 64)
		if err != nil || f <= 0 || math.IsInf(f, 0) || f > 1e6 {
			return fmt.Errorf("%q: want a positive number of CPUs", value)
		}
		s.limit(corev1.ResourceCPU, *resource.NewMilliQuantity(int64(math.Ceil(f*1000)), resource.DecimalSI))
	case "--memory", "-m":
		n, err := units.RAMInBytes(value)
		if err != nil || n <= 0 {
			return fmt.Errorf("%q: want a positive size (b, k, m or g)", value)
		}
		s.limit(corev1.ResourceMemory, *resource.NewQuantity(n, resource.BinarySI))
	case "--entrypoint":
		s.entrypoint = value
	case "--health-cmd":
		s.healthCmd = value
	case "--health-retries":
		n, err := strconv.ParseInt(value, 10, 32)
		if err != nil || n <= 0 {
			return fmt.Errorf("%q: want a positive number", value)
		}
		s.retries, s.healthParams = int32(n), true
	default: // the --health-* durations
		d, err := time.ParseDuration(value)
		if err != nil || d < 0 {
			return fmt.Errorf("%q: want a duration such as 10s", value)
		}
		switch flag {
		case "--health-interval":
			s.interval = d
		case "--health-timeout":
			s.timeout = d
		case "--health-start-period":
			s.startPeriod = d
		}
		s.healthParams = true
	}
	return nil
}

func (s *serviceSpec) limit(name corev1.ResourceName, q resource.Quantity) {
	if s.limits == nil {
		s.limits = corev1.ResourceList{}
	}
	s.limits[name] = q
}

// probe is the sidecar's startupProbe for --health-cmd: the command in a
// shell, as Docker runs it, every interval, failing after retries failures;
// failures within the start period do not count, as in Docker. kubelet
// starts the runner container only once it has passed.
func (s *serviceSpec) probe() *corev1.Probe {
	interval, timeout, retries := s.interval, s.timeout, s.retries
	if interval == 0 {
		interval = dockerHealthInterval
	}
	if timeout == 0 {
		timeout = dockerHealthTimeout
	}
	if retries == 0 {
		retries = dockerHealthRetries
	}
	period := seconds(interval)
	failures := retries + int32(math.Ceil(s.startPeriod.Seconds()/float64(period)))
	return &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", s.healthCmd}}},
		PeriodSeconds:    period,
		TimeoutSeconds:   seconds(timeout),
		FailureThreshold: failures,
		SuccessThreshold: 1,
	}
}

// seconds rounds d up to whole seconds, at least 1, as probes count them.
func seconds(d time.Duration) int32 {
	return int32(max(1, min(math.Ceil(d.Seconds()), math.MaxInt32)))
}
