//go:build e2e

package deploy

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// TestE2EExecutorPodRestricted creates the executor Pods of the shipped pool linux (a plain job
// and a `container:` job), with the runner and the Workload API injected by the pod backend, in
// a namespace that enforces Pod Security's restricted level on the real API server: the shipped
// template and what the backend adds to it pass.
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
	n.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := admin.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := shippedPodConfig(t, buildInNamespace(t, "keda", ns))
	cfg.Client, cfg.Namespace, cfg.Entries = admin, ns, noEntries{}
	b, err := pod.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for task, image := range map[int64]string{1: "", 2: "docker.io/library/node:22-bookworm"} {
		id, err := taskidentity.New(cfg.TrustDomain, "owner/repo", "build", task)
		if err != nil {
			t.Fatal(err)
		}
		a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: task, Pool: "linux", Image: image}, id)
		if err != nil {
			t.Fatal(err)
		}
		w := executor.Worker{Backend: b, Bootstrap: fixedEnvironment{}, Keys: cfg.Keys}
		if ok, err := w.Accept(ctx, a); err != nil || ok {
			t.Fatalf("Accept of task %d (image %q) = %v, %v; want the executor created and waiting to be scheduled", task, image, ok, err)
		}
		pod, err := admin.CoreV1().Pods(ns).Get(ctx, b.PodName(a.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Name != "gdr-install-runner" ||
			len(pod.Spec.Containers[0].Command) != 1 || pod.Spec.Containers[0].Command[0] != "/gdr/bin/runner" {
			t.Errorf("task %d: init containers %d, runner command %q: want the injected runner", task, len(pod.Spec.InitContainers), pod.Spec.Containers[0].Command)
		}
		if image != "" && pod.Spec.Containers[0].Image != image {
			t.Errorf("task %d: runner image %q, want the job's %q", task, pod.Spec.Containers[0].Image, image)
		}
	}
}
