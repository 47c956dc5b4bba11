//go:build e2e

package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestE2EClusterDockerRootless proves, on the test node (no Kubernetes user namespaces
// in the Pod), what a pool's docker capability runs without privilege: the
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
	ctx, cancel := clusterTest(t, 10*time.Minute)
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

// dockerFiles are the docker tests' repository: the probe and the echo service
// (internal/testenv/clusterenv's, built here: static binaries, no base image to pull), a
// Dockerfile that copies the probe and the runner the workflow adds (runner-host's static
// runner), the same with a RUN step (which needs the pool's user namespace), one for echo, and a
// compose file of the two.
func dockerFiles(t *testing.T) map[string]string {
	t.Helper()
	files := map[string]string{
		"app/Dockerfile":      "FROM scratch\nCOPY probe /probe\nCOPY runner /runner\n",
		"app/Dockerfile.run":  "FROM scratch\nCOPY probe /probe\nCOPY runner /runner\nRUN [\"/runner\", \"--version\"]\n",
		"app/Dockerfile.echo": "FROM scratch\nCOPY echo /echo\nENTRYPOINT [\"/echo\"]\n",
		"app/compose.yaml":    dockerCompose,
	}
	for _, name := range []string{"probe", "echo"} {
		out := filepath.Join(t.TempDir(), name)
		cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./internal/testenv/clusterenv/testdata/"+name)
		cmd.Dir, cmd.Env = "..", append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", name, err, b)
		}
		bin, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		files["app/"+name] = string(bin)
	}
	return files
}

// dockerAction is the repository's Docker container action (app/action): its Dockerfile copies
// the probe, which reads the repository's Dockerfile from the job's workspace, writes its input
// to its output and probes targets, each label prefixed "action-".
func dockerAction(targets string) map[string]string {
	args := []string{`"read=app/Dockerfile"`, `"output=greeting:INPUT_WHO"`}
	for _, target := range strings.Fields(targets) {
		args = append(args, strconv.Quote(strings.Replace(target, "connect=", "connect=action-", 1)))
	}
	return map[string]string{
		"app/action/Dockerfile": "FROM scratch\nCOPY probe /probe\nENTRYPOINT [\"/probe\"]\n",
		"app/action/action.yml": `name: greet
description: the probe in a container action
inputs:
  who: {description: whom to greet, required: true}
outputs:
  greeting: {description: the input}
runs:
  using: docker
  image: Dockerfile
  args: [` + strings.Join(args, ", ") + `]
`,
	}
}

// dockerStepsWorkflow runs the steps that are images in the pool runsOn: a `uses: docker://`
// step of the image the job built (with an environment variable, args that read the workspace,
// write an output and probe targets, each label prefixed "step-"), and the repository's Docker
// action built from its Dockerfile (with an input and an output); both outputs on one OUTPUTS line.
func dockerStepsWorkflow(runsOn, targets string) string {
	return `on: push
jobs:
  steps:
    runs-on: ` + runsOn + `
    steps:
` + dockerSetup + `      - run: cp app/probe app/action/probe && docker build -t probe:1 app
      - name: image
        id: image
        uses: docker://probe:1
        env:
          GREETING: hello
        with:
          args: /probe read=app/Dockerfile output=seen:GREETING ` + strings.ReplaceAll(targets, "connect=", "connect=step-") + `
      - name: action
        id: action
        uses: ./app/action
        with:
          who: world
      - run: echo "OUTPUTS ${{ steps.image.outputs.seen }} ${{ steps.action.outputs.greeting }}"
`
}

// dockerCompose is the repository's compose file: the echo service and a client that dials it
// by its service name on the project's network.
const dockerCompose = `services:
  echo:
    build: {context: ., dockerfile: Dockerfile.echo}
  client:
    build: {context: ., dockerfile: Dockerfile}
    command: ["/probe", "dial=echo:7000"]
    depends_on: [echo]
`

// dockerSetup is the docker workflows' first steps: the repository checked out, the probe made
// executable and runner-host's runner beside it.
const dockerSetup = `      - uses: actions/checkout@v4
      - run: chmod +x app/probe app/echo && cp /usr/local/bin/runner app/runner
`

// dockerUsernsWorkflow is what the pool docker-userns (docker.userNamespace) adds: a build with
// a RUN step; a container on the default bridge network probing targets on one BRIDGE line; and
// `docker compose up` of the echo service and a client that dials it by name, then down.
func dockerUsernsWorkflow(targets string) string {
	return `on: push
jobs:
  userns:
    runs-on: docker-userns
    steps:
` + dockerSetup + `      - name: build
        run: docker build --progress plain -t probe:1 -f app/Dockerfile.run app
      - name: bridge
        run: echo "BRIDGE $(docker run --rm probe:1 /probe ` + targets + ` | tr '\n' ' ')"
      - name: compose
        run: |
          cd app
          docker compose up --build --abort-on-container-exit --exit-code-from client
          docker compose down
          echo "COMPOSE-DOWN $(docker ps --all --quiet | wc -l)"
`
}

// dockerWorkflow is TestE2EClusterDocker's workflow in the pool runsOn: first the job itself,
// once the executors' policies select its Pod (NATS refused to it: the condition), probes
// targets (connect=label@addr ...) on one JOB line; then `docker build` of the repository,
// and `docker run` of the image probing the same targets on one CONTAINER line, the runner's
// version printed in a container, and a container writing into the job's workspace (-v).
func dockerWorkflow(runsOn, natsTarget, targets string) string {
	return `on: push
jobs:
  docker:
    runs-on: ` + runsOn + `
    steps:
` + dockerSetup + `      - name: policy
        run: |
          for i in $(seq 1 90); do
            if ./app/probe ` + natsTarget + ` | grep -q '=fail'; then break; fi
            sleep 1
          done
          echo "JOB $(./app/probe ` + targets + ` | tr '\n' ' ')"
      - name: build
        run: docker build -t probe:1 app
      - name: run
        run: |
          echo "CONTAINER $(docker run --rm --network host probe:1 /probe ` + targets + ` | tr '\n' ' ')"
          docker run --rm --network host probe:1 /runner --version
          docker run --rm --network host -v "$PWD:/ws" probe:1 /runner install /ws/copied
          echo "WORKSPACE $(stat -c '%u' copied) $(./copied --version | cut -c1-6)"
`
}

// dockerImagesWorkflow lists the images its job's daemon holds.
const dockerImagesWorkflow = `on: push
jobs:
  images:
    runs-on: docker
    steps:
      - run: |
          echo "IMAGES $(docker image ls --all --quiet | wc -l)"
          if id=$(docker image inspect --format '{{.Id}}' probe:1 2>/dev/null); then echo "PROBE-IMAGE $id"; else echo "PROBE-IMAGE absent"; fi
`

// dockerKilledWorkflow runs a container that probes for ever (the test kills the daemon under
// it), then, the step's failure tolerated, uses the daemon again: the image the job built, and a
// container of it.
const dockerKilledWorkflow = `on: push
jobs:
  killed:
    runs-on: docker
    steps:
` + dockerSetup + `      - run: docker build -t probe:1 app
      - name: slow
        continue-on-error: true
        run: |
          echo SLOW-BEGIN
          timeout 300 docker run --rm --network host probe:1 /probe every=1s connect=slow@127.0.0.1:9
      - name: after
        run: |
          echo AFTER-BEGIN
          docker image inspect --format 'AFTER-IMAGE {{.Id}}' probe:1
          docker run --rm --network host probe:1 /runner --version
`

// TestE2EClusterDocker runs Docker workflows through real Gitea jobs in the pool docker
// (installOptions.docker: linux's template with the docker capability, enabled by
// deploy/README.md's "Docker workflows" block: the executors' namespace at Pod Security
// privileged under deploy/admission's policy), with the shipped NetworkPolicies enforced by
// kube-router:
//
//   - Pod: the executor Pod as the API server stores it: no privileged container, gdr-docker
//     with SETUID and SETGID alone under the Localhost profile, escalation allowed, the node's
//     tun device its alone and read-only, every other container restricted;
//   - Workflow: the job builds the repository's Dockerfile and runs the image; a container it
//     starts reaches exactly what the job reaches (the condition first: the job itself is refused
//     NATS, so the policies select its Pod): not NATS, not another executor, the gateway; the
//     runner's version printed in a container; a container writes into the job's workspace;
//   - Steps: a `uses: docker://` step of the image the job built and the repository's Docker
//     action, built from its Dockerfile, each reading the workspace, setting an output from an
//     environment variable or input, and reaching what the job reaches (the gateway; not NATS,
//     not another executor);
//   - Images: a second repository's job, after the first's ended, sees no image at all;
//   - NoCapability: the same workflows in the pool linux fail, the wrapper's word and the
//     runner's naming the pool setting;
//   - SidecarKilled: dockerd killed under a running container: the step fails saying so, and
//     the job's next docker commands run on the restarted daemon, the image still there.
func TestE2EClusterDocker(t *testing.T) {
	clusterenv.KubeRouterAssets(t) // before the install: skip (or fail, CI=true) at once
	ctx, cancel := clusterTest(t, 20*time.Minute)
	defer cancel()
	in := installKEDAWith(ctx, t, installOptions{docker: true})
	in.c.StartNetworkPolicy(ctx, t)
	in.allowGitea(ctx, t)
	in.g.HostAction(t, giteaenv.VendoredAction("checkout-v4"), "actions", "checkout", "v4")
	executorLabels := executorPod(t, buildKustomization(t, "keda")).Labels
	other := in.runPod(ctx, t, executorLike(executorLabels, "docker-other-executor", echoContainer()))
	natsURL, err := url.Parse(in.nats.url)
	if err != nil {
		t.Fatal(err)
	}
	natsTarget := "connect=nats@" + net.JoinHostPort(in.c.NodeIP(), natsURL.Port())
	targets := natsTarget + " connect=other-executor@" + net.JoinHostPort(other.Status.PodIP, "7000") +
		" connect=gateway@" + net.JoinHostPort(gatewayClusterIP, "443")
	files := dockerFiles(t)
	maps.Copy(files, dockerAction(targets))
	push := func(t *testing.T, name, workflow, text string) string {
		repo := in.g.CreateRepo(t, name)
		f := maps.Clone(files)
		f[".gitea/workflows/"+workflow+".yml"] = text
		in.g.PushFiles(t, repo, f)
		return repo
	}
	var built string
	in.runSteps(ctx, t, []step{
		{"Pod", func(t *testing.T) {
			built = push(t, "built", "docker", dockerWorkflow("docker", natsTarget, targets))
			in.checkDockerPod(ctx, t, built, false)
		}},
		{"Workflow", func(t *testing.T) {
			job := in.waitCompleted(ctx, t, built, "docker", 5*time.Minute)
			log := in.g.JobLogs(t, built, job.ID)
			if job.Conclusion != "success" {
				t.Fatalf("job %+v, want success:\n%s", job, log)
			}
			want := map[string]string{"nats": "fail", "other-executor": "fail", "gateway": "ok"}
			for _, who := range []string{"JOB", "CONTAINER"} {
				got := probeLine(t, log, who)
				t.Logf("%s: %v", who, got)
				for label, result := range want {
					if !strings.HasPrefix(got[label], result) {
						t.Errorf("%s: %s=%s, want %s (line %v)", who, label, got[label], result, got)
					}
				}
			}
			if !runnerVersionLine.MatchString(log) {
				t.Errorf("no runner version line (%s) from the container:\n%s", runnerVersionLine, log)
			}
			if !strings.Contains(log, "WORKSPACE 65532 runner") {
				t.Errorf("no container wrote the runner into the job's workspace as the job's user (WORKSPACE 65532 runner):\n%s", log)
			}
		}},
		{"Steps", func(t *testing.T) {
			repo := push(t, "steps", "steps", dockerStepsWorkflow("docker", targets))
			job := in.waitCompleted(ctx, t, repo, "steps", 5*time.Minute)
			log := in.g.JobLogs(t, repo, job.ID)
			if job.Conclusion != "success" {
				t.Fatalf("job %+v, want success:\n%s", job, log)
			}
			for _, want := range []string{
				"read app/Dockerfile: FROM scratch", "output seen=hello", "output greeting=world", "OUTPUTS hello world",
				"step-nats=fail", "step-other-executor=fail", "step-gateway=ok",
				"action-nats=fail", "action-other-executor=fail", "action-gateway=ok",
			} {
				if !strings.Contains(log, want) {
					t.Errorf("the job's log lacks %q", want)
				}
			}
			if t.Failed() {
				t.Logf("the job's log:\n%s", log)
			}
		}},
		{"Images", func(t *testing.T) {
			repo := push(t, "images", "images", dockerImagesWorkflow)
			job := in.waitCompleted(ctx, t, repo, "images", 5*time.Minute)
			log := in.g.JobLogs(t, repo, job.ID)
			if job.Conclusion != "success" || !strings.Contains(log, "IMAGES 0") || !strings.Contains(log, "PROBE-IMAGE absent") {
				t.Fatalf("job %+v, want success with no image (IMAGES 0, PROBE-IMAGE absent):\n%s", job, log)
			}
		}},
		{"NoCapability", func(t *testing.T) {
			repo := push(t, "refused", "docker", dockerWorkflow("ubuntu-latest", natsTarget, targets))
			job := in.waitCompleted(ctx, t, repo, "docker", 5*time.Minute)
			log := in.g.JobLogs(t, repo, job.ID)
			const want = "docker: no Docker daemon runs beside this job: its runner pool has no docker capability (DOCKER_HOST is unset). An operator enables it per pool with docker: in the pool's profile."
			if job.Conclusion != "failure" || !strings.Contains(log, want) {
				t.Fatalf("job %+v, want failure saying %q:\n%s", job, want, log)
			}
			repo = push(t, "refused-steps", "steps", dockerStepsWorkflow("ubuntu-latest", targets))
			job = in.waitCompleted(ctx, t, repo, "steps", 5*time.Minute)
			log = in.g.JobLogs(t, repo, job.ID)
			const wantSteps = "step image uses `docker://probe:1`, an image to run with Docker, and this executor has no Docker daemon (no Docker daemon: nothing at /var/run/docker.sock): `docker://` steps and Docker actions run in a job of a pod pool whose profile enables the docker capability (`docker:`)"
			if job.Conclusion != "failure" || !strings.Contains(log, wantSteps) {
				t.Fatalf("job %+v, want failure saying %q:\n%s", job, wantSteps, log)
			}
		}},
		{"SidecarKilled", func(t *testing.T) { in.dockerSidecarKilled(ctx, t, push(t, "killed", "killed", dockerKilledWorkflow)) }},
		{"UserNamespace", func(t *testing.T) {
			if pod.DockerIDsPerPod != clusterenv.IDsPerPod {
				t.Fatalf("the test node gives a Pod %d IDs, the docker capability's user namespace needs %d", clusterenv.IDsPerPod, pod.DockerIDsPerPod)
			}
			repo := push(t, "userns", "userns", dockerUsernsWorkflow(targets))
			in.checkDockerPod(ctx, t, repo, true)
			job := in.waitCompleted(ctx, t, repo, "userns", 5*time.Minute)
			log := in.g.JobLogs(t, repo, job.ID)
			if job.Conclusion != "success" {
				t.Fatalf("job %+v, want success:\n%s", job, log)
			}
			got := probeLine(t, log, "BRIDGE")
			t.Logf("BRIDGE: %v", got)
			for label, result := range map[string]string{"nats": "fail", "other-executor": "fail", "gateway": "ok"} {
				if !strings.HasPrefix(got[label], result) {
					t.Errorf("a container on the bridge network: %s=%s, want %s", label, got[label], result)
				}
			}
			for _, want := range []string{`RUN ["/runner", "--version"]`, "dial echo:7000: echo: ping from probe", "COMPOSE-DOWN 0"} {
				if !strings.Contains(log, want) {
					t.Errorf("the job's log lacks %q:\n%s", want, log)
				}
			}
			if !runnerVersionLine.MatchString(log) {
				t.Errorf("no runner version line (%s) from the RUN step:\n%s", runnerVersionLine, log)
			}
		}},
	})
}

// checkDockerPod checks repo's running executor Pod, as the API server stores it, against what
// the docker capability grants (sidecarPodProblems), with or without its user namespace.
func (in *installation) checkDockerPod(ctx context.Context, t *testing.T, repo string, userns bool) {
	t.Helper()
	name := in.executorPod(ctx, t, repo)
	p, err := in.cs.CoreV1().Pods(jobsNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, problem := range sidecarPodProblems(p, pod.DockerContainer, corev1.EnvVar{Name: pod.EnvDockerHost, Value: pod.DockerHost}, userns) {
		t.Error(problem)
	}
}

// allowGitea lets the executors reach Gitea, at a private address here, as the shipped
// policies' PLACEHOLDER tells an operator to (deploy/base/07-network-policies.yaml): jobs check
// out from it.
func (in *installation) allowGitea(ctx context.Context, t *testing.T) {
	t.Helper()
	host, port, err := net.SplitHostPort(in.gitea)
	if err != nil {
		t.Fatalf("Gitea's address %q: %v", in.gitea, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	tcp := corev1.ProtocolTCP
	_, err = in.cs.NetworkingV1().NetworkPolicies(jobsNamespace).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "executors-to-gitea"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"gitea-dynamic-runner.io/runner": "true"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: host + "/32"}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptrTo(intstr.FromInt(p))}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// probeLine parses the log's line "<who> label=result ..." (the probe's connect results).
func probeLine(t *testing.T, log, who string) map[string]string {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		_, rest, ok := strings.Cut(line, who+" ")
		if !ok || !strings.Contains(rest, "=") || strings.Contains(rest, "$(") {
			continue
		}
		got := map[string]string{}
		for _, field := range strings.Fields(rest) {
			if label, result, ok := strings.Cut(field, "="); ok {
				got[label] = result
			}
		}
		return got
	}
	t.Fatalf("no %q line in the job's log:\n%s", who+" ", log)
	return nil
}

// dockerSidecarKilled: dockerd dies under a running container (SIGKILL, as the kernel's OOM
// killer would at the pool's docker resources): the fault first (the sidecar is started again),
// then the outcome: the step says the daemon ended during it, and the job's next docker
// commands wait for the restarted daemon and find the image it built (the data root outlives
// the sidecar's restart), ending in success.
func (in *installation) dockerSidecarKilled(ctx context.Context, t *testing.T, repo string) {
	argv := []string{"/probe", "every=1s", "connect=slow@127.0.0.1:9"}
	var probe, dockerd int
	for deadline := time.Now().Add(3 * time.Minute); dockerd == 0; time.Sleep(500 * time.Millisecond) {
		probe, dockerd = dockerdBeside(t, argv)
		if time.Now().After(deadline) {
			t.Fatalf("no %v beside a dockerd after 3 min", argv)
		}
	}
	in.killSidecar(ctx, t, repo, pod.DockerContainer, dockerd, fmt.Sprintf("dockerd %d, beside the container's /probe %d", dockerd, probe))
	job := in.waitCompleted(ctx, t, repo, "killed", 3*time.Minute)
	log := in.g.JobLogs(t, repo, job.ID)
	slow, after := buildLogs(t, log, "SLOW-BEGIN", "AFTER-BEGIN")
	const ended = "docker: the Docker daemon beside this job stopped answering during this call: its sidecar gdr-docker ended"
	if !strings.Contains(slow, ended) {
		t.Errorf("the step whose daemon died does not say so (%q):\n%s", ended, slow)
	}
	if job.Conclusion != "success" || !strings.Contains(after, "AFTER-IMAGE sha256:") || !runnerVersionLine.MatchString(after) {
		t.Fatalf("job %+v, want success with the image still there and a container run after the restart:\n%s", job, log)
	}
	t.Logf("the killed step ends:\n%s\nthe next one:\n%s", tail(slow, 4), tail(after, 6))
}

// dockerdBeside finds the process whose command line is argv and the dockerd in the same
// container (the same memory cgroup: rootless Docker on cgroup v1 runs its containers in the
// sidecar's), by their PIDs on this machine; 0, 0 while there is none.
func dockerdBeside(t *testing.T, argv []string) (int, int) {
	t.Helper()
	_, procs := nodeProcs(t)
	cgroup := func(p procfs.Proc) string {
		groups, err := p.Cgroups()
		if err != nil {
			return ""
		}
		for _, g := range groups {
			if slices.Contains(g.Controllers, "memory") {
				return g.Path
			}
		}
		return ""
	}
	for _, p := range procs {
		if cmdline, err := p.CmdLine(); err != nil || !slices.Equal(cmdline, argv) {
			continue
		}
		where := cgroup(p)
		if where == "" {
			continue
		}
		for _, d := range procs {
			if comm, err := d.Comm(); err == nil && comm == "dockerd" && cgroup(d) == where {
				return p.PID, d.PID
			}
		}
	}
	return 0, 0
}
