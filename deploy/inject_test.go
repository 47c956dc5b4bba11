package deploy

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

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
