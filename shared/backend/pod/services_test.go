package pod

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/imagepolicy"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// twoServices is a job's `services:` as taskassignment carries them: a
// database with env, a port, a health command and the options that map, and
// a cache with a bare port.
func twoServices() []jobservices.Service {
	return []jobservices.Service{
		{ID: "postgres", Image: "postgres:17", Env: map[string]string{"POSTGRES_PASSWORD": "postgres", "PGDATA": "/tmp/pg"},
			Ports: []string{"5432:5432"}, Cmd: []string{"-c", "fsync=off"}, Volumes: []string{"/var/lib/postgresql/data"},
			Options: `--health-cmd "pg_isready -U postgres" --health-interval=2s --health-timeout 3s --health-retries 5 --health-start-period 9s --user 999:999 --cpus 1.5 --memory 512m --entrypoint docker-entrypoint.sh`},
		{ID: "redis", Image: "redis:7", Ports: []string{"6379/tcp"}, Options: "--no-healthcheck"},
	}
}

func servicesAssignment(t *testing.T, taskID int64, services []jobservices.Service) taskassignment.Assignment {
	t.Helper()
	a := testAssignment(t, taskID, "")
	a.Task.Services = services
	return a
}

// TestServicesPod: each service is a native sidecar after the runner's
// install, hardened (a read-only root, its own emptyDir for /tmp and its
// anonymous volumes, a memory request and limit: --memory or the profile's
// serviceMemory), with what its entry maps onto; every key resolves to the
// Pod; the runner learns the services and the profile's timeout through the
// Secret, and the Pod spec holds no credential.
func TestServicesPod(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	client := fake.NewClientset()
	cfg.Client = client
	cfg.Pools[0].Profile = json.RawMessage(`{"serviceTimeout":"45s","serviceMemory":"256Mi",` + testTemplate[1:])
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := servicesAssignment(t, 11, twoServices())
	if _, err := b.Create(ctx, a, launch(cfg.Keys, a)); err != nil {
		t.Fatal(err)
	}
	pod, err := client.CoreV1().Pods("ci").Get(ctx, b.PodName(a.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range pod.Spec.InitContainers {
		names = append(names, c.Name)
	}
	if want := []string{"gdr-install-runner", "gdr-service-postgres", "gdr-service-redis"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("init containers %v, want %v", names, want)
	}
	always := corev1.ContainerRestartPolicyAlways
	no, yes := false, true
	uid := int64(999)
	hardened := func(user, group *int64) *corev1.SecurityContext {
		return &corev1.SecurityContext{
			RunAsNonRoot: &yes, RunAsUser: user, RunAsGroup: group,
			AllowPrivilegeEscalation: &no, Privileged: &no, ReadOnlyRootFilesystem: &yes,
			Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
	}
	wantPG := corev1.Container{
		Name: "gdr-service-postgres", Image: "postgres:17", RestartPolicy: &always,
		Command: []string{"docker-entrypoint.sh"}, Args: []string{"-c", "fsync=off"},
		Env:   []corev1.EnvVar{{Name: "PGDATA", Value: "/tmp/pg"}, {Name: "POSTGRES_PASSWORD", Value: "postgres"}},
		Ports: []corev1.ContainerPort{{ContainerPort: 5432, Protocol: corev1.ProtocolTCP}},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("512Mi")}},
		StartupProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "pg_isready -U postgres"}}},
			PeriodSeconds: 2, TimeoutSeconds: 3, SuccessThreshold: 1,
			FailureThreshold: 5 + 5, // 5 retries, and the 9s start period in 2s periods
		},
		SecurityContext:          hardened(&uid, &uid),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		ImagePullPolicy:          corev1.PullAlways,
		VolumeMounts: []corev1.VolumeMount{
			{Name: "gdr-service-postgres", MountPath: "/tmp", SubPath: "tmp"},
			{Name: "gdr-service-postgres", MountPath: "/var/lib/postgresql/data", SubPath: "volume-0"},
		},
	}
	wantRedis := corev1.Container{
		Name: "gdr-service-redis", Image: "redis:7", RestartPolicy: &always, Args: []string{},
		Ports:                    []corev1.ContainerPort{{ContainerPort: 6379, Protocol: corev1.ProtocolTCP}},
		Resources:                corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}},
		SecurityContext:          hardened(nil, nil),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		ImagePullPolicy:          corev1.PullAlways,
		VolumeMounts:             []corev1.VolumeMount{{Name: "gdr-service-redis", MountPath: "/tmp", SubPath: "tmp"}},
	}
	for i, want := range []corev1.Container{wantPG, wantRedis} {
		got := pod.Spec.InitContainers[i+1]
		if len(got.Args) == 0 && len(want.Args) == 0 {
			got.Args, want.Args = nil, nil
		}
		if !reflect.DeepEqual(got.Resources.Limits.Cpu().MilliValue(), want.Resources.Limits.Cpu().MilliValue()) ||
			got.Resources.Limits.Memory().Value() != want.Resources.Limits.Memory().Value() ||
			got.Resources.Requests.Memory().Value() != want.Resources.Limits.Memory().Value() {
			t.Errorf("%s resources %v, want limits %v and the memory requested", got.Name, got.Resources, want.Resources.Limits)
		}
		got.Resources, want.Resources = corev1.ResourceRequirements{}, corev1.ResourceRequirements{}
		if !reflect.DeepEqual(got, want) {
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(want)
			t.Errorf("sidecar\n%s\nwant\n%s", gj, wj)
		}
	}
	for _, name := range []string{"gdr-service-postgres", "gdr-service-redis"} {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name })
		if i < 0 || pod.Spec.Volumes[i].EmptyDir == nil {
			t.Errorf("volumes %+v: want the emptyDir %s", pod.Spec.Volumes, name)
		}
	}
	if want := []corev1.HostAlias{{IP: "127.0.0.1", Hostnames: []string{"postgres", "redis"}}}; !reflect.DeepEqual(pod.Spec.HostAliases, want) {
		t.Errorf("hostAliases %+v, want %+v", pod.Spec.HostAliases, want)
	}
	if len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Image != "runner:v1" {
		t.Errorf("containers %+v", pod.Spec.Containers)
	}
	secret, err := client.CoreV1().Secrets("ci").Get(ctx, SecretName(pod.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(secret.Data["CI_JOB_SERVICES"]); got != "postgres,redis" {
		t.Errorf("CI_JOB_SERVICES = %q", got)
	}
	if got := string(secret.Data["CI_JOB_SERVICES_TIMEOUT"]); got != "45s" {
		t.Errorf("CI_JOB_SERVICES_TIMEOUT = %q", got)
	}
	raw, _ := json.Marshal(pod)
	if strings.Contains(string(raw), secretValue) {
		t.Fatal("the Pod object holds a credential")
	}

	// A job without services: no sidecar, no alias, no variables.
	plain := testAssignment(t, 12, "")
	if _, err := b.Create(ctx, plain, launch(cfg.Keys, plain)); err != nil {
		t.Fatal(err)
	}
	pod, err = client.CoreV1().Pods("ci").Get(ctx, b.PodName(plain.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 1 || len(pod.Spec.HostAliases) != 0 {
		t.Errorf("a job without services got %d init containers, aliases %v", len(pod.Spec.InitContainers), pod.Spec.HostAliases)
	}
	secret, err = client.CoreV1().Secrets("ci").Get(ctx, SecretName(pod.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := secret.Data["CI_JOB_SERVICES"]; ok {
		t.Error("a job without services is told of services")
	}
}

// TestJobImagesPullAsThePoolSays: the images the job chose (its services',
// and its container's) are pulled as the pool's images.pullPolicy says,
// Always by default, whatever the template's runner container says; the
// template's own images (the runner's install) keep the template's policy.
func TestJobImagesPullAsThePoolSays(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		pool imagepolicy.PullPolicy
		want corev1.PullPolicy
	}{
		{"", corev1.PullAlways},
		{imagepolicy.PullIfNotPresent, corev1.PullIfNotPresent},
		{imagepolicy.PullNever, corev1.PullNever},
	} {
		cfg := testConfig(t)
		client := fake.NewClientset()
		cfg.Client = client
		cfg.Pools[0].Profile = json.RawMessage(`{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"r:1","imagePullPolicy":"IfNotPresent"}]}}}`)
		cfg.Pools[0].Images.PullPolicy = tc.pool
		b, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		a := servicesAssignment(t, 12, twoServices())
		a.Task.Image = "node:22"
		if _, err := b.Create(ctx, a, launch(cfg.Keys, a)); err != nil {
			t.Fatal(err)
		}
		pod, err := client.CoreV1().Pods("ci").Get(ctx, b.PodName(a.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			want := tc.want
			if c.Name == InstallContainer {
				want = corev1.PullIfNotPresent // the template's runner image, not the job's
			}
			if c.ImagePullPolicy != want {
				t.Errorf("pool pullPolicy %q: container %s (image %s) pulls %q, want %q", tc.pool, c.Name, c.Image, c.ImagePullPolicy, want)
			}
		}
	}
}

// TestJobImagesRefusedByPool: an image outside the pool's images rule fails
// the assignment permanently, naming the image and the rule, and creates
// nothing; allowed ones run.
func TestJobImagesRefusedByPool(t *testing.T) {
	for _, tc := range []struct {
		name     string
		image    string
		services []jobservices.Service
		want     string // "" = created
	}{
		{"allowed", "node:22", twoServices(), ""},
		{"container", "ruby:3", nil, `container image "ruby:3": image not allowed: it matches none of the runner pool's images.allowed [node:*]`},
		{"service", "", []jobservices.Service{{ID: "db", Image: "mysql:8"}}, `service db: image "mysql:8": image not allowed: it matches none of the runner pool's images.services [postgres:*, redis:*]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cfg := testConfig(t)
			client := fake.NewClientset()
			cfg.Client = client
			cfg.Pools[0].Images = imagepolicy.Policy{Allowed: &[]string{"node:*"}, Services: &[]string{"postgres:*", "redis:*"}}
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			a := servicesAssignment(t, 22, tc.services)
			a.Task.Image = tc.image
			_, err = b.Create(ctx, a, launch(cfg.Keys, a))
			pods, _ := client.CoreV1().Pods("ci").List(ctx, metav1.ListOptions{})
			if tc.want == "" {
				if err != nil || len(pods.Items) != 1 {
					t.Fatalf("Create = %v, %d Pods; want the Pod", err, len(pods.Items))
				}
				return
			}
			if err == nil || !executor.IsPermanent(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `runner pool "linux"`) {
				t.Fatalf("Create = %v; want a permanent error naming the pool and %q", err, tc.want)
			}
			if len(pods.Items) != 0 {
				t.Fatalf("a refused image created %d Pods", len(pods.Items))
			}
		})
	}
}

// TestServicesRefused: what cannot run as a sidecar fails the assignment
// permanently, naming the service and the field or option, and creates
// nothing.
func TestServicesRefused(t *testing.T) {
	svc := func(change func(*jobservices.Service)) []jobservices.Service {
		s := jobservices.Service{ID: "db", Image: "postgres:17", Ports: []string{"5432"}}
		change(&s)
		return []jobservices.Service{s}
	}
	opt := func(o string) []jobservices.Service { return svc(func(s *jobservices.Service) { s.Options = o }) }
	for _, tc := range []struct {
		name     string
		services []jobservices.Service
		want     string
	}{
		{"privileged", opt("--privileged"), "option --privileged cannot run"},
		{"network", opt("--network host"), "option --network cannot run"},
		{"network=", opt("--network=host"), "option --network cannot run"},
		{"cap-add", opt("--cap-add NET_ADMIN"), "option --cap-add cannot run"},
		{"volume option", opt("-v /var/run/docker.sock:/var/run/docker.sock"), "option -v cannot run"},
		{"env option", opt("-e A=1"), "option -e cannot run"},
		{"positional", opt("postgres"), `"postgres" is not a flag`},
		{"user by name", opt("--user postgres"), "numeric user ID"},
		{"root", opt("--user 0"), "do not run as root"},
		{"bad group", opt("--user 999:pg"), "numeric group ID"},
		{"cpus", opt("--cpus lots"), "option --cpus"},
		{"memory", opt("--memory 1x"), "option --memory"},
		{"no value", opt("--memory"), "option --memory: no value"},
		{"retries", opt("--health-cmd true --health-retries 0"), "option --health-retries"},
		{"interval", opt("--health-cmd true --health-interval soon"), "option --health-interval"},
		{"health params alone", opt("--health-interval 1s"), "need --health-cmd"},
		{"quoting", opt(`--health-cmd "unterminated`), "options:"},
		{"expression in options", opt("--cpus ${{ matrix.cpus }}"), "options holds a ${{ }} expression"},
		{"secret in env", svc(func(s *jobservices.Service) { s.Env = map[string]string{"POSTGRES_PASSWORD": "${{ secrets.DB }}"} }), "env POSTGRES_PASSWORD holds a ${{ }} expression"},
		{"expression in image", svc(func(s *jobservices.Service) { s.Image = "postgres:${{ matrix.pg }}" }), "image holds"},
		{"expression in ports", svc(func(s *jobservices.Service) { s.Ports = []string{"${{ matrix.port }}"} }), "ports holds a ${{ }} expression"},
		{"expression in cmd", svc(func(s *jobservices.Service) { s.Cmd = []string{"${{ vars.X }}"} }), "cmd holds"},
		{"host volume", svc(func(s *jobservices.Service) { s.Volumes = []string{"/data:/data"} }), `volumes: "/data:/data": only anonymous volumes`},
		{"named volume", svc(func(s *jobservices.Service) { s.Volumes = []string{"pgdata:/var/lib/postgresql/data"} }), "only anonymous volumes"},
		{"relative volume", svc(func(s *jobservices.Service) { s.Volumes = []string{"data"} }), "only anonymous volumes"},
		{"root volume", svc(func(s *jobservices.Service) { s.Volumes = []string{"/"} }), "cannot be the root directory"},
		{"volume at /tmp", svc(func(s *jobservices.Service) { s.Volumes = []string{"/tmp/"} }), "mounted twice"},
		{"credentials", svc(func(s *jobservices.Service) { s.Credentials = true }), "imagePullSecrets"},
		{"remapped port", svc(func(s *jobservices.Service) { s.Ports = []string{"15432:5432"} }), "another number"},
		{"udp", svc(func(s *jobservices.Service) { s.Ports = []string{"53/udp"} }), "only TCP"},
		{"key not a hostname", svc(func(s *jobservices.Service) { s.ID = "my_db" }), "DNS label"},
		{"upper-case key", svc(func(s *jobservices.Service) { s.ID = "Postgres" }), "DNS label"},
		{"long key", svc(func(s *jobservices.Service) { s.ID = strings.Repeat("a", 52) }), "at most 51"},
		{"same port twice", append(svc(func(*jobservices.Service) {}), jobservices.Service{ID: "db2", Image: "postgres:17", Ports: []string{"5432"}}), "both declare port 5432"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cfg := testConfig(t)
			client := fake.NewClientset()
			cfg.Client = client
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			a := servicesAssignment(t, 21, tc.services)
			_, err = b.Create(ctx, a, launch(cfg.Keys, a))
			if err == nil || !executor.IsPermanent(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Create = %v; want a permanent error with %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "service") {
				t.Errorf("error %q names no service", err)
			}
			if strings.Contains(err.Error(), "secrets.DB") {
				t.Errorf("error %q quotes the value", err)
			}
			if pods, _ := client.CoreV1().Pods("ci").List(ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
				t.Fatalf("a refused assignment created %d Pods", len(pods.Items))
			}
		})
	}
}

func TestServiceDefaultsAndReservedNames(t *testing.T) {
	for _, tc := range []struct{ profile, err string }{
		{`{"serviceTimeout":"0s",` + testTemplate[1:], "serviceTimeout"},
		{`{"serviceTimeout":"-1m",` + testTemplate[1:], "serviceTimeout"},
		{`{"serviceTimeout":"soon",` + testTemplate[1:], `invalid duration "soon"`},
		{`{"serviceMemory":"0",` + testTemplate[1:], "serviceMemory: 0 is not positive"},
		{`{"serviceMemory":"lots",` + testTemplate[1:], "serviceMemory"},
		{`{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"r:1"},{"name":"gdr-service-db","image":"x"}]}}}`, `prefix "gdr-service-" is reserved`},
		{`{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"r:1"}],"volumes":[{"name":"gdr-service-db","emptyDir":{}}]}}}`, `spec.volumes[gdr-service-db]: the prefix "gdr-service-" is reserved`},
	} {
		cfg := testConfig(t)
		cfg.Pools[0].Profile = json.RawMessage(tc.profile)
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("New(%s) = %v, want an error with %q", tc.profile, err, tc.err)
		}
	}
	b, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.pools["linux"].serviceTimeout; got != DefaultServiceTimeout {
		t.Fatalf("default service timeout %v", got)
	}
	if got := b.pools["linux"].serviceMemory; got.String() != DefaultServiceMemory {
		t.Fatalf("default service memory %v, want %s", got.String(), DefaultServiceMemory)
	}
}
