//go:build e2e

package deploy

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
)

// TestE2EClusterDockerRootless proves, on the test node (containerd 1.6, runc 1.1.5: no
// Kubernetes user namespaces), what the docker image (make images; issue 45, not yet a pool
// capability) runs without privilege: rootless dockerd under RootlessKit as a native sidecar
// (65532, every capability dropped but SETUID and SETGID for newuidmap's and newgidmap's file
// capabilities, the build capability's Localhost seccomp profile), and runner-host's Docker CLI
// in a client container hardened like every executor container, through the socket in their
// shared emptyDir.
//
//   - NoTun: the fault first: without the node's /dev/net/tun (a CharDevice hostPath volume),
//     slirp4netns cannot make RootlessKit's tap device, the daemon never starts, and the CLI
//     says that the daemon beside the job does not answer;
//   - WithTun: the daemon answers (server 26.1.5, rootless), `docker build` of a Dockerfile
//     without RUN makes an image, and `docker run --network host` of it runs the runner, whose
//     version line it prints (gdr-runc gives the container the sidecar's /proc).
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
		phase, logs := runDockerPod(ctx, t, cs, "docker-no-tun", false, "docker version")
		if phase != corev1.PodFailed || !strings.Contains(logs["dockerd"], "setting up tap tap0") ||
			!strings.Contains(logs["client"], "docker: the Docker daemon beside this job did not answer in 20s") {
			t.Fatalf("phase %s, want Failed with the sidecar's tap error and the CLI's word:\n%s", phase, logs)
		}
	})
	t.Run("WithTun", func(t *testing.T) {
		script := `set -eux
docker version --format 'server {{.Server.Version}}'
docker info --format 'security {{.SecurityOptions}}'
mkdir -p /tmp/ctx && cp /usr/local/bin/runner /tmp/ctx/runner && printf 'FROM scratch\nCOPY runner /runner\n' >/tmp/ctx/Dockerfile
docker build -t probe /tmp/ctx
docker run --rm --network host probe /runner --version
`
		phase, logs := runDockerPod(ctx, t, cs, "docker-with-tun", true, script)
		if phase != corev1.PodSucceeded {
			t.Fatalf("phase %s, want Succeeded:\n%s", phase, logs)
		}
		for _, want := range []string{"server 26.1.5", "name=rootless", "naming to docker.io/library/probe"} {
			if !strings.Contains(logs["client"], want) {
				t.Errorf("client's log lacks %q:\n%s", want, logs["client"])
			}
		}
		if !runnerVersionLine.MatchString(logs["client"]) {
			t.Errorf("client's log lacks the runner's version line (%s), printed in the container:\n%s", runnerVersionLine, logs["client"])
		}
	})
}

// runDockerPod runs a Pod whose docker sidecar has the node's /dev/net/tun if tun, and whose
// client runs script with DOCKER_HOST set; it returns the Pod's final phase and each
// container's log.
func runDockerPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string, tun bool, script string) (corev1.PodPhase, map[string]string) {
	t.Helper()
	hardened := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptrTo(false), ReadOnlyRootFilesystem: ptrTo(true),
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	mount := func(vol, at string) corev1.VolumeMount { return corev1.VolumeMount{Name: vol, MountPath: at} }
	emptyDir := func(vol string) corev1.Volume {
		return corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	}
	sidecarMounts := []corev1.VolumeMount{mount("socket", "/run/docker-socket"), mount("state", "/home/nonroot/.local/share/docker"), mount("dtmp", "/tmp")}
	volumes := []corev1.Volume{emptyDir("socket"), emptyDir("state"), emptyDir("dtmp"), emptyDir("tmp"), emptyDir("home")}
	if tun {
		sidecarMounts = append(sidecarMounts, mount("tun", "/dev/net/tun"))
		volumes = append(volumes, corev1.Volume{Name: "tun", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: "/dev/net/tun", Type: ptrTo(corev1.HostPathCharDev)}}})
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: ptrTo(false),
			SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptrTo(int64(65532)), RunAsGroup: ptrTo(int64(65532)), RunAsNonRoot: ptrTo(true), FSGroup: ptrTo(int64(65532))},
			InitContainers: []corev1.Container{{
				Name: "dockerd", Image: "gdr.local/gitea-dynamic-runner-docker:latest", ImagePullPolicy: corev1.PullNever,
				RestartPolicy: ptrTo(corev1.ContainerRestartPolicyAlways),
				Env:           []corev1.EnvVar{{Name: "XDG_RUNTIME_DIR", Value: "/tmp"}},
				SecurityContext: &corev1.SecurityContext{
					Privileged: ptrTo(false), AllowPrivilegeEscalation: ptrTo(true), ReadOnlyRootFilesystem: ptrTo(true),
					Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"SETUID", "SETGID"}},
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptrTo(pod.DefaultBuildSeccompProfile)},
				},
				VolumeMounts: sidecarMounts,
			}},
			Containers: []corev1.Container{{
				Name: "client", Image: "gdr.local/gitea-dynamic-runner-runner-host:latest", ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/sh", "-c", script}, SecurityContext: hardened,
				Env: []corev1.EnvVar{{Name: "DOCKER_HOST", Value: "unix:///run/docker-socket/docker.sock"}, {Name: "GDR_DOCKER_WAIT", Value: "20"}},
				VolumeMounts: []corev1.VolumeMount{{Name: "socket", MountPath: "/run/docker-socket", ReadOnly: true},
					mount("tmp", "/tmp"), mount("home", "/home/nonroot")},
			}},
			Volumes: volumes,
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var phase corev1.PodPhase
	for deadline := time.Now().Add(4 * time.Minute); ; time.Sleep(time.Second) {
		got, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if phase = got.Status.Phase; phase == corev1.PodSucceeded || phase == corev1.PodFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Pod %s still %s after 4 minutes: %+v", name, phase, got.Status)
		}
	}
	logs := map[string]string{}
	for _, container := range []string{"dockerd", "client"} {
		rc, err := cs.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{Container: container}).Stream(ctx)
		if err != nil {
			logs[container] = fmt.Sprintf("(no log: %v)", err)
			continue
		}
		b, _ := io.ReadAll(rc)
		_ = rc.Close()
		logs[container] = string(b)
	}
	return phase, logs
}
