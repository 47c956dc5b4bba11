//go:build e2e

package pod

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
)

// TestE2EServicesPod creates, on the real API server and in a namespace that
// enforces Pod Security's restricted level, the Pod of a job with two
// services: the server must accept native sidecars (init containers with
// restartPolicy Always, a startup probe, ports) and the host alias, and
// store them as built. A service the backend refuses creates nothing.
func TestE2EServicesPod(t *testing.T) {
	env := newEnv(t)
	ctx := ctxT(t)
	ns, err := env.client.CoreV1().Namespaces().Get(ctx, env.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := env.client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := env.config(nil)
	cfg.Pools[0].Profile = json.RawMessage(withProfile(`"runnerImage":"gdr-runner:v1","serviceTimeout":"90s"`))
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}

	a := testAssignment(t, 31, "node:22-bookworm")
	a.Task.Services = twoServices()
	if _, err := b.Create(ctx, a, launch(env.keys, a)); err != nil {
		t.Fatalf("Create = %v", err)
	}
	pod, err := env.client.CoreV1().Pods(env.ns).Get(ctx, b.PodName(a.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range pod.Spec.InitContainers {
		names = append(names, c.Name)
	}
	if want := []string{"gdr-install-runner", "gdr-service-postgres", "gdr-service-redis"}; !slices.Equal(names, want) {
		t.Fatalf("stored init containers %v, want %v", names, want)
	}
	if p := pod.Spec.InitContainers[0].RestartPolicy; p != nil {
		t.Errorf("the install container is restartable (%s): it must run to completion", *p)
	}
	pg, redis := pod.Spec.InitContainers[1], pod.Spec.InitContainers[2]
	for _, c := range []corev1.Container{pg, redis} {
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("%s: restartPolicy %v, want Always (a native sidecar)", c.Name, c.RestartPolicy)
		}
	}
	if pr := pg.StartupProbe; pr == nil || pr.Exec == nil || !slices.Equal(pr.Exec.Command, []string{"/bin/sh", "-c", "pg_isready -U postgres"}) ||
		pr.PeriodSeconds != 2 || pr.TimeoutSeconds != 3 || pr.FailureThreshold != 10 {
		t.Errorf("postgres startupProbe %+v", pr)
	}
	if len(pg.Ports) != 1 || pg.Ports[0].ContainerPort != 5432 || len(redis.Ports) != 1 || redis.Ports[0].ContainerPort != 6379 {
		t.Errorf("ports %+v, %+v", pg.Ports, redis.Ports)
	}
	if u := pg.SecurityContext.RunAsUser; u == nil || *u != 999 {
		t.Errorf("postgres runAsUser %v, want 999 (--user)", u)
	}
	if got := pg.Resources.Limits.Memory().String(); got != "512Mi" {
		t.Errorf("postgres memory limit %s", got)
	}
	if len(pod.Spec.HostAliases) != 1 || pod.Spec.HostAliases[0].IP != "127.0.0.1" ||
		!slices.Equal(pod.Spec.HostAliases[0].Hostnames, []string{"postgres", "redis"}) {
		t.Errorf("hostAliases %+v", pod.Spec.HostAliases)
	}
	if got := pod.Spec.Containers[0].Image; got != "node:22-bookworm" {
		t.Errorf("runner image %s", got)
	}
	raw, _ := json.Marshal(pod)
	if strings.Contains(string(raw), secretValue) {
		t.Fatal("the Pod object holds a credential")
	}
	secret, err := env.client.CoreV1().Secrets(env.ns).Get(ctx, SecretName(pod.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(secret.Data["CI_JOB_SERVICES"]) != "postgres,redis" || string(secret.Data["CI_JOB_SERVICES_TIMEOUT"]) != "1m30s" {
		t.Errorf("runner told services %q, timeout %q", secret.Data["CI_JOB_SERVICES"], secret.Data["CI_JOB_SERVICES_TIMEOUT"])
	}

	refused := testAssignment(t, 32, "")
	refused.Task.Services = []jobservices.Service{{ID: "db", Image: "postgres:17", Options: "--privileged"}}
	if _, err := b.Create(ctx, refused, launch(env.keys, refused)); !executor.IsPermanent(err) || !strings.Contains(err.Error(), "--privileged") {
		t.Fatalf("Create(--privileged) = %v, want a permanent error naming the option", err)
	}
	if _, err := env.client.CoreV1().Pods(env.ns).Get(ctx, b.PodName(refused.ID), metav1.GetOptions{}); err == nil {
		t.Fatal("a refused service created a Pod")
	}
}
