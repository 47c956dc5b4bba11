//go:build e2e

package deploy

import (
	"context"
	"maps"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// podSecurityRestricted are the labels of the executors' namespace (deploy/REFERENCE.md,
// "Namespaces"): Pod Security's restricted level enforced, audited and warned.
var podSecurityRestricted = map[string]string{
	"pod-security.kubernetes.io/enforce": "restricted",
	"pod-security.kubernetes.io/audit":   "restricted",
	"pod-security.kubernetes.io/warn":    "restricted",
}

// TestE2EExecutorPodRestricted creates the executor Pods of the shipped pool linux (a plain job,
// a `container:` job and one with `services:` sidecars), with the runner injected and the SVID
// minted by the pod backend, in a namespace labelled as the executors' namespace is
// (podSecurityRestricted: Pod Security's restricted level enforced, audited and warned) on the
// real API server: the shipped template and what the backend adds to it pass.
func TestE2EExecutorPodRestricted(t *testing.T) {
	p := plane.Plane(t)
	admin := p.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := p.Namespace(t)
	n, err := admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(n.Labels, podSecurityRestricted)
	if _, err := admin.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := shippedPodConfig(t, buildInNamespace(t, "keda", ns))
	cfg.Client, cfg.Namespace, cfg.Entries = admin, ns, noEntries{}
	b, err := pod.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	services := []jobservices.Service{
		{ID: "db", Image: "postgres:17", Ports: []string{"5432"}, Volumes: []string{"/var/lib/postgresql/data"}, Options: "--user 999:999 --memory 1g"},
		{ID: "cache", Image: "redis:7", Ports: []string{"6379"}},
	}
	for _, task := range []taskassignment.Task{
		{ID: 1, Pool: "linux"},
		{ID: 2, Pool: "linux", Image: "docker.io/library/node:22-bookworm"},
		{ID: 3, Pool: "linux", Image: "docker.io/library/node:22-bookworm", Services: services},
	} {
		image := task.Image
		id, err := taskidentity.New(cfg.TrustDomain, "owner/repo", "build", task.ID)
		if err != nil {
			t.Fatal(err)
		}
		a, err := taskassignment.New(taskassignment.BackendPod, task, id)
		if err != nil {
			t.Fatal(err)
		}
		w := executor.Worker{Backend: b, Bootstrap: fixedEnvironment{}, Keys: cfg.Keys}
		// The shipped identity is minted (in the Pod's Secret): bound at once.
		if ok, err := w.Accept(ctx, a); err != nil || !ok {
			t.Fatalf("Accept of task %d (image %q) = %v, %v; want the executor created and its minted SVID bound", task.ID, image, ok, err)
		}
		pod, err := admin.CoreV1().Pods(ns).Get(ctx, b.PodName(a.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// A job in runner-host runs the runner runner-host holds; a job in its own image
		// gets it installed.
		install, command := 1, "/gdr/bin/runner"
		if image == "" {
			install, command = 0, "/usr/local/bin/runner"
		}
		if len(pod.Spec.InitContainers) != install+len(task.Services) || (install == 1 && pod.Spec.InitContainers[0].Name != "gdr-install-runner") ||
			len(pod.Spec.Containers[0].Command) != 1 || pod.Spec.Containers[0].Command[0] != command {
			t.Errorf("task %d: init containers %d, runner command %q: want %d install container and %s", task.ID, len(pod.Spec.InitContainers), pod.Spec.Containers[0].Command, install, command)
		}
		if image != "" && pod.Spec.Containers[0].Image != image {
			t.Errorf("task %d: runner image %q, want the job's %q", task.ID, pod.Spec.Containers[0].Image, image)
		}
	}
}
