//go:build e2e

package deploy

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
)

// runReadmeBuildBlock runs the block name of README.md's "Image builds" (runReadmeBlock).
func runReadmeBuildBlock(ctx context.Context, t testing.TB, c *clusterenv.Cluster, name string) {
	t.Helper()
	runReadmeBlock(ctx, t, c, "build", name)
}

// runReadmeBlock runs the block of phase named name (deploy/README.md's "Image builds": build,
// "Docker workflows": docker) as written (bash, from the checkout's root, kubectl with the
// cluster's admin kubeconfig), but for the kubelet's folder: the test node's --root-dir for
// /var/lib/kubelet.
func runReadmeBlock(ctx context.Context, t testing.TB, c *clusterenv.Cluster, phase, name string) {
	t.Helper()
	var text string
	for _, b := range readmePhase(t, phase) {
		if b.name == name {
			text = b.text
		}
	}
	if text == "" {
		t.Fatalf("README.md has no %s block %q", phase, name)
	}
	kubectl := testenv.RequirePeer(t, testenv.Peer{Name: "kubectl", Version: kubectlVersion, Executables: []string{"kubectl"}})
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", strings.ReplaceAll(text, "/var/lib/kubelet", filepath.Join(c.Dir, "kubelet")))
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "PATH="+kubectl+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+c.AdminKubeconfig())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README block %s %s: %v\n%s", phase, name, err, out)
	}
}

// TestE2EClusterBuildKitRootless proves, on the test node (no Kubernetes user namespaces
// in the Pod), that the build capability's seccomp exception is needed and
// enough: the buildkit image as a native sidecar (65532, every capability dropped but SETUID and
// SETGID, which newuidmap's and newgidmap's file capabilities need, privilege escalation allowed
// for them) and a client container hardened like every executor container (RuntimeDefault, no
// capability, read-only root) building through the sidecar's socket in their shared emptyDir.
//
//   - RuntimeDefault: the fault first: containerd's default seccomp profile refuses the clone of
//     a new user namespace without CAP_SYS_ADMIN, so RootlessKit cannot start its child;
//   - Localhost gdr/buildkit.json (deploy/seccomp, installed by README's block): the build's RUN
//     step runs and the image is exported.
func TestE2EClusterBuildKitRootless(t *testing.T) {
	ctx, cancel := clusterTest(t, 10*time.Minute)
	defer cancel()
	images := imagesFolder(t)
	c := clusterenv.Start(ctx, t)
	for _, name := range []string{"buildkit", "runner-host"} {
		if err := c.ImportImage(ctx, filepath.Join(images, name), "gdr.local/gitea-dynamic-runner-"+name); err != nil {
			t.Fatal(err)
		}
	}
	cs := c.Client(t)
	c.WaitServiceAccount(ctx, t, "default")
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "dockerfile"},
		Data:       map[string]string{"Dockerfile": "FROM scratch\nCOPY runner /runner\nRUN [\"/runner\", \"--version\"]\n"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("RuntimeDefault", func(t *testing.T) {
		phase, logs := runBuildPod(ctx, t, cs, "build-runtime-default", &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault})
		want := "failed to start the child: fork/exec /proc/self/exe: operation not permitted"
		if phase != corev1.PodFailed || !strings.Contains(logs["buildkitd"], want) {
			t.Fatalf("phase %s, want Failed with the sidecar's %q:\n%s", phase, want, logs)
		}
	})
	t.Run("Localhost", func(t *testing.T) {
		runReadmeBuildBlock(ctx, t, c, "seccomp")
		phase, logs := runBuildPod(ctx, t, cs, "build-localhost", &corev1.SeccompProfile{
			Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptrTo(pod.DefaultBuildSeccompProfile)})
		if phase != corev1.PodSucceeded {
			t.Fatalf("phase %s, want Succeeded:\n%s", phase, logs)
		}
		for _, want := range []string{`RUN ["/runner", "--version"]`, "exporting manifest sha256:", "sending tarball"} {
			if !strings.Contains(logs["client"], want) {
				t.Errorf("client's log lacks %q:\n%s", want, logs["client"])
			}
		}
		// The RUN step ran the runner, which printed its version line
		// (stamped from a clone, "(devel)" without stamps).
		if !runnerVersionLine.MatchString(logs["client"]) {
			t.Errorf("client's log lacks the runner's version line (%s):\n%s", runnerVersionLine, logs["client"])
		}
	})
}

// runBuildPod runs a Pod whose buildkit sidecar has the seccomp profile sp and whose client
// builds the ConfigMap dockerfile's Dockerfile with the runner binary as its context; it returns
// the Pod's final phase and each container's log.
func runBuildPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string, sp *corev1.SeccompProfile) (corev1.PodPhase, map[string]string) {
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
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptrTo(false),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsUser: ptrTo(int64(65532)), RunAsGroup: ptrTo(int64(65532)), RunAsNonRoot: ptrTo(true), FSGroup: ptrTo(int64(65532)),
			},
			InitContainers: []corev1.Container{
				{
					// The build context: the static runner, which copies itself.
					Name: "context", Image: "gdr.local/gitea-dynamic-runner-runner-host:latest", ImagePullPolicy: corev1.PullNever,
					Command: []string{"/usr/local/bin/runner", "install", "/context/runner"}, SecurityContext: hardened,
					VolumeMounts: []corev1.VolumeMount{mount("context", "/context")},
				},
				{
					Name: "buildkitd", Image: "gdr.local/gitea-dynamic-runner-buildkit:latest", ImagePullPolicy: corev1.PullNever,
					RestartPolicy: ptrTo(corev1.ContainerRestartPolicyAlways),
					Env:           []corev1.EnvVar{{Name: "XDG_RUNTIME_DIR", Value: "/tmp"}}, // runc's and RootlessKit's state
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptrTo(true),
						Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"SETUID", "SETGID"}},
						SeccompProfile:           sp,
					},
					VolumeMounts: []corev1.VolumeMount{mount("socket", "/run/buildkit"), mount("state", "/home/nonroot/.local/share/buildkit")},
				},
			},
			Containers: []corev1.Container{{
				Name: "client", Image: "gdr.local/gitea-dynamic-runner-buildkit:latest", ImagePullPolicy: corev1.PullNever,
				Command: []string{"/usr/local/bin/buildctl"},
				Args: []string{"--addr", "unix:///run/buildkit/buildkitd.sock", "--wait", "build", "--progress", "plain",
					"--frontend", "dockerfile.v0", "--local", "context=/context", "--local", "dockerfile=/dockerfile",
					"--output", "type=oci,dest=/tmp/image.tar"},
				SecurityContext: hardened,
				VolumeMounts: []corev1.VolumeMount{mount("socket", "/run/buildkit"), mount("context", "/context"),
					mount("dockerfile", "/dockerfile"), mount("tmp", "/tmp")},
			}},
			Volumes: []corev1.Volume{
				emptyDir("socket"), emptyDir("state"), emptyDir("context"), emptyDir("tmp"),
				{Name: "dockerfile", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "dockerfile"}}}},
			},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return waitPodEnd(ctx, t, cs, name, "buildkitd", "client")
}

// waitPodEnd waits up to 4 minutes for the Pod name of the namespace default to end and returns
// its final phase and the log of each of containers.
func waitPodEnd(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string, containers ...string) (corev1.PodPhase, map[string]string) {
	t.Helper()
	var phase corev1.PodPhase
	for deadline := time.Now().Add(4 * time.Minute); ; time.Sleep(time.Second) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if phase = p.Status.Phase; phase == corev1.PodSucceeded || phase == corev1.PodFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Pod %s still %s after 4 minutes: %+v", name, phase, p.Status)
		}
	}
	logs := map[string]string{}
	for _, container := range containers {
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
