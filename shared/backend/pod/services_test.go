package pod

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// twoServices is a job's `services:` as taskassignment carries them: a
// database with env, a port, a health command and the options that map, and
// a cache with a bare port.
func twoServices() []jobservices.Service {
	return []jobservices.Service{
		{ID: "postgres", Image: "postgres:17", Env: map[string]string{"POSTGRES_PASSWORD": "postgres", "PGDATA": "/tmp/pg"},
			Ports: []string{"5432:5432"}, Cmd: []string{"-c", "fsync=off"},
			Options: `--health-cmd "pg_isready -U postgres" --health-interval=2s --health-timeout 3s --health-retries 5 --health-start-period 9s --user 999:999 --cpus 1.5 --memory 512m --entrypoint docker-entrypoint.sh`},
		{ID: "redis", Image: "redis:7", Ports: []string{"6379/tcp"}, Options: "--no-healthcheck -m 64m"},
	}
}

func servicesAssignment(t *testing.T, taskID int64, services []jobservices.Service) taskassignment.Assignment {
	t.Helper()
	a := testAssignment(t, taskID, "")
	a.Task.Services = services
	return a
}

// TestServicesPod: each service is a native sidecar after the runner's
// install, hardened, with what its entry maps onto; every key resolves to
// the Pod; the runner learns the services and the profile's timeout through
// the Secret, and the Pod spec holds no credential.
func TestServicesPod(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	client := fake.NewClientset()
	cfg.Client = client
	cfg.Pools[0].Profile = json.RawMessage(`{"serviceTimeout":"45s",` + testTemplate[1:])
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
			AllowPrivilegeEscalation: &no, Privileged: &no,
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
	}
	wantRedis := corev1.Container{
		Name: "gdr-service-redis", Image: "redis:7", RestartPolicy: &always, Args: []string{},
		Ports:                    []corev1.ContainerPort{{ContainerPort: 6379, Protocol: corev1.ProtocolTCP}},
		Resources:                corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
		SecurityContext:          hardened(nil, nil),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	for i, want := range []corev1.Container{wantPG, wantRedis} {
		got := pod.Spec.InitContainers[i+1]
		if len(got.Args) == 0 && len(want.Args) == 0 {
			got.Args, want.Args = nil, nil
		}
		if !reflect.DeepEqual(got.Resources.Limits.Cpu().MilliValue(), want.Resources.Limits.Cpu().MilliValue()) ||
			got.Resources.Limits.Memory().Value() != want.Resources.Limits.Memory().Value() {
			t.Errorf("%s resources %v, want %v", got.Name, got.Resources, want.Resources)
		}
		got.Resources, want.Resources = corev1.ResourceRequirements{}, corev1.ResourceRequirements{}
		if !reflect.DeepEqual(got, want) {
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(want)
			t.Errorf("sidecar\n%s\nwant\n%s", gj, wj)
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

// TestServicesPullAsTheRunner: a service's image is pulled as the template's
// runner container's (the install container's too), so a node that holds
// the images beforehand runs a job's services without a registry.
func TestServicesPullAsTheRunner(t *testing.T) {
	ctx := context.Background()
	for _, policy := range []corev1.PullPolicy{"", corev1.PullIfNotPresent, corev1.PullNever} {
		cfg := testConfig(t)
		client := fake.NewClientset()
		cfg.Client = client
		cfg.Pools[0].Profile = json.RawMessage(`{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"r:1","imagePullPolicy":"` + string(policy) + `"}]}}}`)
		b, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		a := servicesAssignment(t, 12, twoServices())
		if _, err := b.Create(ctx, a, launch(cfg.Keys, a)); err != nil {
			t.Fatal(err)
		}
		pod, err := client.CoreV1().Pods("ci").Get(ctx, b.PodName(a.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range pod.Spec.InitContainers {
			if c.ImagePullPolicy != policy {
				t.Errorf("runner pulls %q: init container %s pulls %q", policy, c.Name, c.ImagePullPolicy)
			}
		}
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
		{"volumes", svc(func(s *jobservices.Service) { s.Volumes = []string{"/data:/data"} }), "volumes are not supported"},
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

func TestServiceTimeoutAndReservedNames(t *testing.T) {
	for _, tc := range []struct{ profile, err string }{
		{`{"serviceTimeout":"0s",` + testTemplate[1:], "serviceTimeout"},
		{`{"serviceTimeout":"-1m",` + testTemplate[1:], "serviceTimeout"},
		{`{"serviceTimeout":"soon",` + testTemplate[1:], `invalid duration "soon"`},
		{`{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"r:1"},{"name":"gdr-service-db","image":"x"}]}}}`, `prefix "gdr-service-" is reserved`},
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
}
