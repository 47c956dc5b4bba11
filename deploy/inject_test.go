package deploy

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestExecutorPodWithServicesHardened builds, with the real pod backend, the executor Pod of a
// job of the shipped pool linux that chose its own container image and two `services:` (one
// with an anonymous volume and --memory, one with nothing), and runs the hardening check of
// TestPodsHardened on the whole Pod: every sidecar has a read-only root, its own /tmp and a
// memory request and limit, and the job's images are pulled Always.
func TestExecutorPodWithServicesHardened(t *testing.T) {
	task := taskassignment.Task{ID: 43, Pool: "linux", Image: "node:22", Services: []jobservices.Service{
		{ID: "db", Image: "postgres:17", Ports: []string{"5432"}, Volumes: []string{"/var/lib/postgresql/data"}, Options: "--user 999:999 --memory 1g"},
		{ID: "cache", Image: "redis:7", Ports: []string{"6379"}},
	}}
	for _, dir := range []string{"keda", "knative"} {
		t.Run(dir, func(t *testing.T) {
			pod := executorPodFor(t, installed(loadManifests(t), dir), task)
			var sidecars int
			for _, c := range pod.Spec.InitContainers {
				if strings.HasPrefix(c.Name, "gdr-service-") {
					sidecars++
					if c.ImagePullPolicy != corev1.PullAlways {
						t.Errorf("service %s pulls %q, want Always", c.Name, c.ImagePullPolicy)
					}
				}
			}
			if sidecars != 2 {
				t.Fatalf("%d service sidecars, want 2", sidecars)
			}
			for _, prob := range hardeningProblems(podTemplate{path: "executor Pod with services", labels: pod.Labels, spec: pod.Spec, pool: "linux"}) {
				t.Error(prob)
			}
			// The check sees the sidecars: one without its /tmp is caught.
			bad := *pod.Spec.DeepCopy()
			for i, c := range bad.InitContainers {
				if c.Name == "gdr-service-cache" {
					bad.InitContainers[i].VolumeMounts = nil
				}
			}
			if !slices.ContainsFunc(hardeningProblems(podTemplate{spec: bad, pool: "linux"}), func(p string) bool {
				return strings.Contains(p, "container gdr-service-cache: volumeMounts: want an emptyDir at /tmp")
			}) {
				t.Error("a sidecar without its /tmp goes unnoticed")
			}
		})
	}
}

// TestExecutorPodInjectedAndHardened builds, with the real pod backend, the executor Pods of the
// shipped pool linux (keda and knative install the same gdr-pools) and checks what the backend
// injects: for a job in runner-host, the runner runner-host holds (runnerInImage), with no init
// container; for a job in its own image (container:), the init container copying the runner from
// the runner image (not runner-host) into an emptyDir and the runner container running it from
// there; in both, the SVID minted into the Pod's Secret (GDR_POD_IDENTITY's default), so no
// Workload API volume, no SPIFFE_ENDPOINT_SOCKET and no hostPath; and that the whole Pod, init
// container included, meets the hardened baseline of TestPodsHardened.
func TestExecutorPodInjectedAndHardened(t *testing.T) {
	for _, dir := range []string{"keda", "knative"} {
		t.Run(dir, func(t *testing.T) {
			docs := installed(loadManifests(t), dir)
			host := executorPod(t, docs)
			own := executorPodFor(t, docs, taskassignment.Task{ID: 42, Pool: "linux", Image: "docker.io/library/node:22-bookworm"})
			for _, pod := range []*corev1.Pod{host, own} {
				for _, prob := range hardeningProblems(podTemplate{path: "executor Pod", labels: pod.Labels, spec: pod.Spec, pool: "linux"}) {
					t.Error(prob)
				}
			}
			// The check sees the init container: a writable root filesystem there is caught.
			bad := *own.Spec.DeepCopy()
			if len(bad.InitContainers) > 0 && bad.InitContainers[0].SecurityContext != nil {
				no := false
				bad.InitContainers[0].SecurityContext.ReadOnlyRootFilesystem = &no
				if !slices.ContainsFunc(hardeningProblems(podTemplate{spec: bad, pool: "linux"}), func(p string) bool {
					return strings.Contains(p, "gdr-install-runner: securityContext.readOnlyRootFilesystem")
				}) {
					t.Error("a writable root filesystem in the init container goes unnoticed")
				}
			}
			runner := func(spec corev1.PodSpec) corev1.Container {
				return spec.Containers[slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "runner" })]
			}

			if len(host.Spec.InitContainers) != 0 {
				t.Errorf("host job: init containers %+v, want none (runner-host holds the runner)", host.Spec.InitContainers)
			}
			if c := runner(host.Spec); c.Image != "ghcr.io/example/gitea-dynamic-runner-runner-host:latest" || !slices.Equal(c.Command, []string{"/usr/local/bin/runner"}) {
				t.Errorf("host job: runner container image %s command %q: want runner-host running its own /usr/local/bin/runner", c.Image, c.Command)
			}

			if len(own.Spec.InitContainers) != 1 {
				t.Fatalf("container job: init containers %+v, want the runner's", own.Spec.InitContainers)
			}
			ic := own.Spec.InitContainers[0]
			if ic.Name != "gdr-install-runner" || ic.Image != "ghcr.io/example/gitea-dynamic-runner-runner:latest" ||
				!slices.Equal(ic.Args, []string{"install", "/gdr/bin/runner"}) {
				t.Errorf("init container %s image %s args %q: want gdr-install-runner, the runner image, install /gdr/bin/runner", ic.Name, ic.Image, ic.Args)
			}
			c := runner(own.Spec)
			if c.Image != "docker.io/library/node:22-bookworm" || !slices.Equal(c.Command, []string{"/gdr/bin/runner"}) {
				t.Errorf("container job: runner container image %s command %q: want the job's image running /gdr/bin/runner", c.Image, c.Command)
			}
			mounts := map[string]bool{}
			for _, m := range c.VolumeMounts {
				mounts[m.MountPath] = m.ReadOnly
			}
			if ro, ok := mounts["/gdr/bin"]; !ok || !ro {
				t.Errorf("container job: runner mounts %+v: want the runner read-only at /gdr/bin", c.VolumeMounts)
			}

			for _, pod := range []*corev1.Pod{host, own} {
				for _, e := range runner(pod.Spec).Env {
					if e.Name == "SPIFFE_ENDPOINT_SOCKET" {
						t.Errorf("%s: the runner names a Workload API socket, but its SVID is minted", pod.Name)
					}
				}
				for _, v := range pod.Spec.Volumes {
					if v.CSI != nil || v.HostPath != nil {
						t.Errorf("%s: volume %s: a Workload API (CSI or hostPath) in an executor whose SVID is minted", pod.Name, v.Name)
					}
				}
			}
		})
	}
}
