//go:build e2e

package deploy

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestE2EClusterDockerRootless proves, on the test node (containerd 1.6, runc 1.1.5: no
// Kubernetes user namespaces), what a pool's docker capability runs without privilege: the
// sidecar the pod backend injects (the docker image: rootless dockerd under RootlessKit, 65532,
// every capability dropped but SETUID and SETGID for newuidmap's and newgidmap's file
// capabilities, the build capability's Localhost seccomp profile, the node's /dev/net/tun), and
// runner-host's Docker CLI in a client container hardened like every executor container, which
// mounts the job's /tmp as the runner container does.
//
//   - NoTun: the fault first: without the node's /dev/net/tun (a CharDevice hostPath volume),
//     slirp4netns cannot make RootlessKit's tap device, the daemon never starts, and the
//     sidecar's startup probe holds the client back while the sidecar is started again;
//   - WithTun: the daemon answers (server 26.1.5, rootless), `docker build` of a Dockerfile
//     without RUN makes an image, and `docker run --network host` of it runs the runner, whose
//     version line it prints (gdr-runc gives the container the sidecar's /proc); a container
//     writes into the job's /tmp through `-v` at the runner's own path, as the job's user.
//
// What does not work here yet, and why (docs/DOCKER.md): containers on a bridge network (the
// Pod's /proc/sys is read-only, so dockerd cannot enable forwarding or set a veth's IPv6 in its
// network namespace), and RUN in `docker build` (dockerd's BuildKit mounts a new procfs).
func TestE2EClusterDockerRootless(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	images := imagesFolder(t)
	c := clusterenv.Start(ctx, t)
	for _, name := range []string{"docker", "runner-host"} {
		if err := c.ImportImage(ctx, filepath.Join(images, name), "gdr.local/gitea-dynamic-runner-"+name); err != nil {
			t.Fatal(err)
		}
	}
	cs := c.Client(t)
	c.WaitServiceAccount(ctx, t, "default")
	runReadmeBuildBlock(ctx, t, c, "seccomp")

	t.Run("NoTun", func(t *testing.T) {
		createDockerPod(ctx, t, cs, "docker-no-tun", false, "docker version")
		// The sidecar's startup probe holds the client back; the sidecar ends and is
		// started again, its last words the tap it could not make.
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(2 * time.Second) {
			got, err := cs.CoreV1().Pods("default").Get(ctx, "docker-no-tun", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var sidecar *corev1.ContainerStatus
			for i, st := range got.Status.InitContainerStatuses {
				if st.Name == "dockerd" {
					sidecar = &got.Status.InitContainerStatuses[i]
				}
			}
			if sidecar != nil && sidecar.RestartCount > 0 && sidecar.LastTerminationState.Terminated != nil &&
				strings.Contains(sidecar.LastTerminationState.Terminated.Message, "failed to setup network") {
				if got.Status.Phase != corev1.PodPending || len(got.Status.ContainerStatuses) > 0 && got.Status.ContainerStatuses[0].State.Running != nil {
					t.Fatalf("the client runs though the daemon never started: %+v", got.Status)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the sidecar did not end for want of its tap in 3 minutes: %+v", got.Status)
			}
		}
		if err := cs.CoreV1().Pods("default").Delete(ctx, "docker-no-tun", metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("WithTun", func(t *testing.T) {
		script := `set -eux
docker version --format 'server {{.Server.Version}}'
docker info --format 'security {{.SecurityOptions}}'
mkdir -p /tmp/ctx && cp /usr/local/bin/runner /tmp/ctx/runner && printf 'FROM scratch\nCOPY runner /runner\n' >/tmp/ctx/Dockerfile
docker build -t probe /tmp/ctx
docker run --rm --network host probe /runner --version
mkdir /tmp/ws && docker run --rm --network host -v /tmp/ws:/ws probe /runner install /ws/copied
echo "WS $(stat -c '%u %a' /tmp/ws/copied) $(/tmp/ws/copied --version | cut -c1-6)"
`
		createDockerPod(ctx, t, cs, "docker-with-tun", true, script)
		phase, logs := waitPodEnd(ctx, t, cs, "docker-with-tun", "dockerd", "client")
		if phase != corev1.PodSucceeded {
			t.Fatalf("phase %s, want Succeeded:\n%s", phase, logs)
		}
		// WS: a container wrote into the job's /tmp through a bind mount at the runner's path,
		// as the job's user (the sidecar's user, root in its user namespace).
		for _, want := range []string{"server 26.1.5", "name=rootless", "naming to docker.io/library/probe", "WS 65532 755 runner"} {
			if !strings.Contains(logs["client"], want) {
				t.Errorf("client's log lacks %q:\n%s", want, logs["client"])
			}
		}
		if !runnerVersionLine.MatchString(logs["client"]) {
			t.Errorf("client's log lacks the runner's version line (%s), printed in the container:\n%s", runnerVersionLine, logs["client"])
		}
	})
}

// createDockerPod creates a Pod whose docker sidecar and its volumes are exactly what the pod
// backend injects for a pool with docker (pod.ParseProfile, the docker image imported), less
// the node's /dev/net/tun unless tun, and whose client, hardened as every executor container,
// mounts the work volume tmp at /tmp as the runner container does and runs script with
// DOCKER_HOST set.
func createDockerPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string, tun bool, script string) {
	t.Helper()
	keys, err := taskassignment.NewKeys("test.local")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := pod.ParseProfile(json.RawMessage(`{"docker":{"image":"gdr.local/gitea-dynamic-runner-docker:latest"},`+
		`"podTemplate":{"spec":{"volumes":[{"name":"tmp","emptyDir":{}}],"containers":[{"name":"runner","image":"r:1","imagePullPolicy":"Never",`+
		`"volumeMounts":[{"name":"tmp","mountPath":"/tmp"}]}]}}}`), keys)
	if err != nil {
		t.Fatal(err)
	}
	var sidecar corev1.Container
	for _, c := range tmpl.Spec.InitContainers {
		if c.Name == pod.DockerContainer {
			sidecar = c
		}
	}
	var volumes []corev1.Volume
	for _, v := range tmpl.Spec.Volumes {
		if strings.HasPrefix(v.Name, pod.DockerContainer) || v.Name == "tmp" {
			if v.HostPath != nil && !tun {
				continue
			}
			volumes = append(volumes, v)
		}
	}
	if !tun {
		sidecar.VolumeMounts = slices.DeleteFunc(sidecar.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == pod.TunDevice })
	}
	sidecar.Name = "dockerd"
	hardened := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptrTo(false), ReadOnlyRootFilesystem: ptrTo(true),
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: ptrTo(false),
			SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptrTo(int64(65532)), RunAsGroup: ptrTo(int64(65532)), RunAsNonRoot: ptrTo(true), FSGroup: ptrTo(int64(65532))},
			InitContainers:  []corev1.Container{sidecar},
			Containers: []corev1.Container{{
				Name: "client", Image: "gdr.local/gitea-dynamic-runner-runner-host:latest", ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/sh", "-c", script}, SecurityContext: hardened,
				Env: []corev1.EnvVar{{Name: pod.EnvDockerHost, Value: pod.DockerHost}, {Name: "GDR_DOCKER_WAIT", Value: "20"}, {Name: "HOME", Value: "/tmp"}},
				VolumeMounts: []corev1.VolumeMount{{Name: "gdr-docker-socket", MountPath: pod.DockerSocketDir, ReadOnly: true},
					{Name: "tmp", MountPath: "/tmp"}},
			}},
			Volumes: volumes,
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
