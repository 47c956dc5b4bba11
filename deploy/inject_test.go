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

// TestExecutorPodInjectedAndHardened builds, with the real pod backend, the executor Pod of the
// shipped pool linux (keda and knative install the same gdr-pools) and checks what the backend
// injects: the init container copying the runner from the runner image (not runner-host) into an
// emptyDir, the runner container running it from there, the SPIFFE CSI volume and
// SPIFFE_ENDPOINT_SOCKET; and that the whole Pod, init container included, meets the hardened
// baseline of TestPodsHardened.
func TestExecutorPodInjectedAndHardened(t *testing.T) {
	for _, dir := range []string{"keda", "knative"} {
		t.Run(dir, func(t *testing.T) {
			pod := executorPod(t, installed(loadManifests(t), dir))
			for _, prob := range hardeningProblems(podTemplate{path: "executor Pod", labels: pod.Labels, spec: pod.Spec, pool: "linux"}) {
				t.Error(prob)
			}
			// The check sees the init container: a writable root filesystem there is caught.
			bad := *pod.Spec.DeepCopy()
			if len(bad.InitContainers) > 0 && bad.InitContainers[0].SecurityContext != nil {
				no := false
				bad.InitContainers[0].SecurityContext.ReadOnlyRootFilesystem = &no
				if !slices.ContainsFunc(hardeningProblems(podTemplate{spec: bad, pool: "linux"}), func(p string) bool {
					return strings.Contains(p, "gdr-install-runner: securityContext.readOnlyRootFilesystem")
				}) {
					t.Error("a writable root filesystem in the init container goes unnoticed")
				}
			}
			spec := pod.Spec
			if len(spec.InitContainers) != 1 {
				t.Fatalf("init containers %+v, want the runner's", spec.InitContainers)
			}
			ic := spec.InitContainers[0]
			if ic.Name != "gdr-install-runner" || ic.Image != "ghcr.io/example/gitea-dynamic-runner-runner:latest" ||
				!slices.Equal(ic.Args, []string{"install", "/gdr/bin/runner"}) {
				t.Errorf("init container %s image %s args %q: want gdr-install-runner, the runner image, install /gdr/bin/runner", ic.Name, ic.Image, ic.Args)
			}
			c := spec.Containers[slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "runner" })]
			if c.Image != "ghcr.io/example/gitea-dynamic-runner-runner-host:latest" || !slices.Equal(c.Command, []string{"/gdr/bin/runner"}) {
				t.Errorf("runner container image %s command %q: want runner-host running /gdr/bin/runner", c.Image, c.Command)
			}
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			if env["SPIFFE_ENDPOINT_SOCKET"] != "unix:///spiffe-workload-api/spire-agent.sock" {
				t.Errorf("runner SPIFFE_ENDPOINT_SOCKET %q", env["SPIFFE_ENDPOINT_SOCKET"])
			}
			volumes := map[string]bool{}
			for _, v := range spec.Volumes {
				switch {
				case v.CSI != nil && v.CSI.Driver == "csi.spiffe.io" && v.CSI.ReadOnly != nil && *v.CSI.ReadOnly:
					volumes["csi"] = true
				case v.HostPath != nil:
					t.Errorf("volume %s: a hostPath in the shipped executor", v.Name)
				}
			}
			mounts := map[string]bool{}
			for _, m := range c.VolumeMounts {
				mounts[m.MountPath] = m.ReadOnly
			}
			if !volumes["csi"] || !mounts["/spiffe-workload-api"] || !mounts["/gdr/bin"] {
				t.Errorf("volumes %+v, runner mounts %+v: want the read-only SPIFFE CSI volume at /spiffe-workload-api and the runner read-only at /gdr/bin",
					spec.Volumes, c.VolumeMounts)
			}
		})
	}
}
