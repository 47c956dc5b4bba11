//go:build e2e

package deploy

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/procfs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
)

// podSecurityBuild is the executors' namespace's Pod Security labels where a pool builds
// images (README, "Image builds"): baseline enforced, restricted still audited and warned.
var podSecurityBuild = map[string]string{
	"pod-security.kubernetes.io/enforce": "baseline",
	"pod-security.kubernetes.io/audit":   "restricted",
	"pod-security.kubernetes.io/warn":    "restricted",
}

// podSecurityDocker is the executors' namespace's Pod Security labels where a pool runs Docker
// (deploy/README.md, "Docker workflows"): privileged enforced (the tun device's hostPath; the
// admission policy carries baseline's checks), restricted still audited and warned.
var podSecurityDocker = map[string]string{
	"pod-security.kubernetes.io/enforce": "privileged",
	"pod-security.kubernetes.io/audit":   "restricted",
	"pod-security.kubernetes.io/warn":    "restricted",
}

// buildDockerfile is the repository's Dockerfile: the runner-host image's static runner is the
// build context (there is no registry to pull a base image from), and a RUN step runs it.
const buildDockerfile = "FROM scratch\nCOPY runner /runner\nRUN [\"/runner\", \"--version\"]\n"

// buildWorkflow checks out the repository and builds its Dockerfile twice with buildctl through
// BUILDKIT_HOST, the first time to an OCI tarball whose index.json and small blobs (base64) and
// large blobs' sizes it prints; the markers split the two builds' logs.
func buildWorkflow(runsOn string) string {
	return `on: push
jobs:
  image:
    runs-on: ` + runsOn + `
    steps:
      - uses: actions/checkout@v4
      - run: cp /usr/local/bin/runner app/runner
      - name: build
        run: |
          echo BUILD-ONE
          buildctl build --progress plain --frontend dockerfile.v0 --local context=app --local dockerfile=app --output "type=oci,dest=$RUNNER_TEMP/image.tar"
      - name: again
        run: |
          echo BUILD-TWO
          buildctl build --progress plain --frontend dockerfile.v0 --local context=app --local dockerfile=app --output "type=oci,dest=$RUNNER_TEMP/again.tar"
      - name: show
        run: |
          cd "$RUNNER_TEMP" && mkdir oci && tar -xf image.tar -C oci
          echo "OCI-INDEX $(base64 -w0 oci/index.json)"
          for f in oci/blobs/sha256/*; do
            size=$(stat -c %s "$f")
            if [ "$size" -lt 65536 ]; then echo "OCI-BLOB $(basename "$f") $(base64 -w0 "$f")"; else echo "OCI-LARGE $(basename "$f") $size"; fi
          done
`
}

// TestE2EClusterBuild runs image builds through the pool build (installOptions.build: linux's
// template with the build capability) on the test cluster, installed as README says:
//
//   - Pod: the executor Pod the pod backend made for a build job, as the API server stores it
//     (admitted by the namespace's Pod Security baseline and deploy/admission's policy),
//     has no privileged container, no capability added but the sidecar's SETUID and SETGID, the
//     sidecar alone under the Localhost profile and allowed privilege escalation, every other
//     container RuntimeDefault, and no hostUsers (user namespaces are not offered yet: deploy/REFERENCE.md
//     says why);
//   - Admission: that Pod changed three ways baseline alone admits (checked first, in a
//     namespace at baseline without the policy) is refused in the executors' namespace by
//     deploy/admission's policy, with its message;
//   - Workflow: the job builds the repository's Dockerfile with buildctl, its RUN step runs,
//     and the OCI tarball it exports is checked here (index, manifest and config by digest, every
//     layer by digest or size); its second build of the same Dockerfile is CACHED (the cache
//     works, and this test would see it);
//   - NoCapability: the same workflow in the pool linux fails, with the wrapper's word naming
//     the pool setting;
//   - CacheIsolation: the same workflow in another repository, after the first ended, builds
//     from nothing (no step CACHED): no job sees another's build cache;
//   - SidecarKilled: BuildKit killed in the middle of a build fails that build, saying so, and
//     the job's next build runs on the sidecar the kubelet started again (buildSidecarKilled);
//   - MissingProfile: the same workflow in a pool whose seccomp profile no node has fails, its
//     log naming the sidecar and the kubelet's reason (buildMissingProfile).
func TestE2EClusterBuild(t *testing.T) {
	ctx, cancel := clusterTest(t, 15*time.Minute)
	defer cancel()
	in := installKEDAWith(ctx, t, installOptions{build: true})
	in.g.HostAction(t, giteaenv.VendoredAction("checkout-v4"), "actions", "checkout", "v4")
	push := func(t *testing.T, name, runsOn string) string {
		repo := in.g.CreateRepo(t, name)
		in.g.PushFiles(t, repo, map[string]string{"app/Dockerfile": buildDockerfile, ".gitea/workflows/image.yml": buildWorkflow(runsOn)})
		return repo
	}
	var built, refused, noProfile string
	var stored *corev1.Pod
	in.runSteps(ctx, t, []step{
		{"Pod", func(t *testing.T) {
			built, refused = push(t, "built", "build"), push(t, "refused", "ubuntu-latest")
			noProfile = push(t, "noprofile", "build-noprofile")
			name := in.executorPod(ctx, t, built)
			p, err := in.cs.CoreV1().Pods(jobsNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, problem := range buildPodProblems(p) {
				t.Error(problem)
			}
			stored = p
		}},
		{"Admission", func(t *testing.T) { in.buildAdmission(ctx, t, stored) }},
		{"Workflow", func(t *testing.T) {
			job := in.waitCompleted(ctx, t, built, "image", 5*time.Minute)
			log := in.g.JobLogs(t, built, job.ID)
			if job.Conclusion != "success" {
				t.Fatalf("job %+v, want success:\n%s", job, log)
			}
			one, two := buildLogs(t, log, "BUILD-ONE", "BUILD-TWO")
			if !strings.Contains(one, `[2/2] RUN ["/runner", "--version"]`) || strings.Contains(one, "CACHED") {
				t.Errorf("the first build did not run its RUN step from nothing:\n%s", one)
			}
			if !strings.Contains(two, "CACHED") {
				t.Errorf("the second build of the same Dockerfile in the same job used no cache:\n%s", two)
			}
			checkOCITarball(t, log)
		}},
		{"NoCapability", func(t *testing.T) {
			job := in.waitCompleted(ctx, t, refused, "image", 5*time.Minute)
			log := in.g.JobLogs(t, refused, job.ID)
			want := "buildctl: no BuildKit runs beside this job: its runner pool has no build capability (BUILDKIT_HOST is unset). An operator enables it per pool with build: in the pool's profile"
			if job.Conclusion != "failure" || !strings.Contains(log, want) {
				t.Fatalf("job %+v, want failure with %q:\n%s", job, want, log)
			}
		}},
		{"CacheIsolation", func(t *testing.T) {
			other := push(t, "other", "build")
			job := in.waitCompleted(ctx, t, other, "image", 5*time.Minute)
			log := in.g.JobLogs(t, other, job.ID)
			if job.Conclusion != "success" {
				t.Fatalf("job %+v, want success:\n%s", job, log)
			}
			if one, _ := buildLogs(t, log, "BUILD-ONE", "BUILD-TWO"); strings.Contains(one, "CACHED") {
				t.Fatalf("another repository's build found a step CACHED:\n%s", one)
			}
		}},
		{"SidecarKilled", func(t *testing.T) { in.buildSidecarKilled(ctx, t, in.g.CreateRepo(t, "killed")) }},
		{"MissingProfile", func(t *testing.T) { in.buildMissingProfile(ctx, t, noProfile) }},
		{"NothingLeft", func(t *testing.T) { in.nothingLeft(ctx, t) }},
	})
}

// killedWorkflow builds, in the pool build, an image whose RUN step sleeps slowSleep seconds
// (no base image to pull: /bin/sleep and the libraries its loader lists are the context),
// with continue-on-error, then a quick one.
const killedWorkflow = `on: push
jobs:
  killed:
    runs-on: build
    steps:
      - name: context
        run: |
          mkdir -p "$RUNNER_TEMP/ctx/root" && cd "$RUNNER_TEMP/ctx"
          for f in /bin/sleep $(/lib64/ld-linux-x86-64.so.2 --list /bin/sleep | grep -o '/[^ ]*'); do cp --parents -L "$f" root/; done
          printf 'FROM scratch\nCOPY root/ /\nRUN ["/bin/sleep", "` + slowSleep + `"]\n' > Dockerfile.slow
          printf 'FROM scratch\nCOPY root/ /\nRUN ["/bin/sleep", "1"]\n' > Dockerfile
      - name: slow
        continue-on-error: true
        run: |
          cd "$RUNNER_TEMP/ctx" && echo BUILD-SLOW
          buildctl build --progress plain --frontend dockerfile.v0 --local context=. --local dockerfile=. --opt filename=Dockerfile.slow
      - name: after
        run: |
          cd "$RUNNER_TEMP/ctx" && echo BUILD-AFTER
          buildctl build --progress plain --frontend dockerfile.v0 --local context=. --local dockerfile=.
`

// slowSleep is the slow build's RUN step's sleep, in seconds: long enough that only the kill
// ends it within the test, and a number no other process of the machine sleeps.
const slowSleep = "2971"

// buildSidecarKilled: BuildKit dies in the middle of a job's build (SIGKILL, as the kernel's
// OOM killer would at the sidecar's memory limit). The fault first: the slow build's RUN step
// runs under the Pod's buildkitd, which the kill ends, and the kubelet starts the sidecar again
// (its restart count rises). Then the job: the build in progress fails at once, the wrapper
// saying that BuildKit ended during the call; the next step's build, in the same job and Pod,
// succeeds on the restarted sidecar (the wrapper waited for it where it was not yet back).
func (in *installation) buildSidecarKilled(ctx context.Context, t *testing.T, repo string) {
	in.g.PushWorkflow(t, repo, ".gitea/workflows/killed.yml", killedWorkflow)
	var sleeper, buildkitd int
	for deadline := time.Now().Add(3 * time.Minute); sleeper == 0; time.Sleep(500 * time.Millisecond) {
		sleeper, buildkitd = sleepUnderBuildkitd(t, []string{"/bin/sleep", slowSleep})
		if time.Now().After(deadline) {
			t.Fatalf("no /bin/sleep %s under a buildkitd after 3 min", slowSleep)
		}
	}
	in.killSidecar(ctx, t, repo, pod.BuildContainer, buildkitd, fmt.Sprintf("buildkitd %d, the parent of the RUN step's /bin/sleep %d", buildkitd, sleeper))
	job := in.waitCompleted(ctx, t, repo, "killed", 3*time.Minute)
	log := in.g.JobLogs(t, repo, job.ID)
	slow, after := buildLogs(t, log, "BUILD-SLOW", "BUILD-AFTER")
	const ended = "buildctl: BuildKit beside this job stopped answering during this call: its sidecar gdr-buildkit ended"
	if !strings.Contains(slow, ended) {
		t.Errorf("the build BuildKit died in does not say so (%q):\n%s", ended, slow)
	}
	if job.Conclusion != "success" || !strings.Contains(after, `RUN ["/bin/sleep", "1"]`) {
		t.Fatalf("job %+v, want success with the second build's RUN step:\n%s", job, log)
	}
	t.Logf("the killed build ends:\n%s\nthe next one:\n%s", tail(slow, 4), tail(after, 8))
}

// killSidecar kills the process pid (what, for the log) in the sidecar of repo's running
// executor Pod with SIGKILL, and waits until the kubelet has started the sidecar again: the
// fault asserted before the test looks at the outcome.
func (in *installation) killSidecar(ctx context.Context, t *testing.T, repo, sidecar string, pid int, what string) {
	t.Helper()
	name := in.executorPod(ctx, t, repo)
	restarts := func() int32 {
		p, err := in.cs.CoreV1().Pods(jobsNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cs := range p.Status.InitContainerStatuses {
			if cs.Name == sidecar {
				return cs.RestartCount
			}
		}
		t.Fatalf("Pod %s has no %s status", name, sidecar)
		return 0
	}
	before := restarts()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s: %v", what, err)
	}
	t.Logf("killed %s, in %s (restarts before: %d)", what, name, before)
	for deadline := time.Now().Add(time.Minute); restarts() <= before; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the sidecar %s of %s was not started again within a minute of the kill", sidecar, name)
		}
	}
}

// sleepUnderBuildkitd finds the process whose command line is argv and its nearest ancestor
// named buildkitd, by their PIDs on this machine; 0, 0 while there is none.
func sleepUnderBuildkitd(t *testing.T, argv []string) (int, int) {
	t.Helper()
	fs, procs := nodeProcs(t)
	for _, p := range procs {
		if cmdline, err := p.CmdLine(); err != nil || !slices.Equal(cmdline, argv) {
			continue
		}
		for pid := p.PID; pid > 1; {
			parent, err := fs.Proc(pid)
			if err != nil {
				break // gone
			}
			stat, err := parent.Stat()
			if err != nil {
				break
			}
			if pid != p.PID && stat.Comm == "buildkitd" {
				return p.PID, pid
			}
			pid = stat.PPID
		}
	}
	return 0, 0
}

// nodeProcs returns this machine's /proc and its processes: the test node's kubelet runs
// here, so a container's processes are among them.
func nodeProcs(t *testing.T) (procfs.FS, procfs.Procs) {
	t.Helper()
	fs, err := procfs.NewFS(procfs.DefaultMountPoint)
	if err != nil {
		t.Fatal(err)
	}
	procs, err := fs.AllProcs()
	if err != nil {
		t.Fatal(err)
	}
	return fs, procs
}

// missingSeccompProfile is the seccomp profile of the pool build-noprofile: on no node.
const missingSeccompProfile = "gdr/absent.json"

// buildMissingProfile: the job of repo, in the pool build-noprofile, cannot start its sidecar
// (its Localhost profile is on no node); the fault first, the sidecar waiting in
// CreateContainerError over the profile, then the job: failed, its log naming the container
// and the reason, once the Pod has waited pod.StuckAfter and recover's next pass ran.
func (in *installation) buildMissingProfile(ctx context.Context, t *testing.T, repo string) {
	var created time.Time
	for deadline := time.Now().Add(pod.StuckAfter); ; time.Sleep(time.Second) {
		pods, err := in.cs.CoreV1().Pods(jobsNamespace).List(ctx, metav1.ListOptions{LabelSelector: executorSelector})
		if err != nil {
			t.Fatal(err)
		}
		var waiting string
		for _, p := range pods.Items {
			if p.Annotations[repositoryAnnotation] != repo {
				continue
			}
			created = p.CreationTimestamp.Time
			for _, cs := range p.Status.InitContainerStatuses {
				if w := cs.State.Waiting; cs.Name == pod.BuildContainer && w != nil {
					waiting = w.Reason + ": " + w.Message
				}
			}
		}
		if strings.HasPrefix(waiting, "CreateContainerError: ") && strings.Contains(waiting, "seccomp") {
			t.Logf("the sidecar waits: %s", waiting)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sidecar of %s's executor is not waiting on its seccomp profile (last: %q)", repo, waiting)
		}
	}
	// A pass of recover ends it once the Pod has waited StuckAfter: the scheduled one (every 5
	// minutes, deploy/keda/05-recover.yaml) or, not to wait for it, one started then.
	select {
	case <-time.After(time.Until(created.Add(pod.StuckAfter + 2*time.Second))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	in.recoverNow(ctx, t)
	job := in.waitCompleted(ctx, t, repo, "image", 3*time.Minute)
	log := in.g.JobLogs(t, repo, job.ID)
	want := "container " + pod.BuildContainer + ": CreateContainerError: "
	if job.Conclusion != "failure" || !strings.Contains(log, want) {
		t.Fatalf("job %+v, want failure with %q:\n%s", job, want, log)
	}
}

// buildLogs splits a build job's log at the workflow's markers, the lines whose text (after
// Gitea's timestamp) is first and second (a step's echo of its script says "echo first"): from
// first to second, and from second on.
func buildLogs(t *testing.T, log, first, second string) (string, string) {
	t.Helper()
	lines := strings.Split(log, "\n")
	one, two := -1, -1
	for i, line := range lines {
		_, text, _ := strings.Cut(line, " ")
		switch strings.TrimSpace(text) {
		case first:
			one = i
		case second:
			two = i
		}
	}
	if one < 0 || two < one {
		t.Fatalf("no %s and %s marker lines in order:\n%s", first, second, log)
	}
	return strings.Join(lines[one:two], "\n"), strings.Join(lines[two:], "\n")
}

var (
	ociIndexLine = regexp.MustCompile(`OCI-INDEX ([A-Za-z0-9+/=]+)\s*$`)
	ociBlobLine  = regexp.MustCompile(`OCI-BLOB ([0-9a-f]{64}) ([A-Za-z0-9+/=]+)\s*$`)
	ociLargeLine = regexp.MustCompile(`OCI-LARGE ([0-9a-f]{64}) ([0-9]+)\s*$`)
)

// checkOCITarball checks the OCI layout the workflow printed: index.json names one image
// manifest, whose bytes hash to its digest; the config, likewise, is linux/amd64 with the RUN
// step in its history; every layer is there, small ones by digest, large ones by size.
func checkOCITarball(t *testing.T, log string) {
	t.Helper()
	var index []byte
	blobs, large := map[string][]byte{}, map[string]int64{}
	for _, line := range strings.Split(log, "\n") {
		if m := ociIndexLine.FindStringSubmatch(line); m != nil {
			index = decodeBase64(t, m[1])
		}
		if m := ociBlobLine.FindStringSubmatch(line); m != nil {
			b := decodeBase64(t, m[2])
			if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != m[1] {
				t.Fatalf("blob %s: its bytes hash to %x", m[1], sum)
			}
			blobs["sha256:"+m[1]] = b
		}
		if m := ociLargeLine.FindStringSubmatch(line); m != nil {
			large["sha256:"+m[1]], _ = strconv.ParseInt(m[2], 10, 64)
		}
	}
	var idx ocispec.Index
	if err := json.Unmarshal(index, &idx); err != nil || len(idx.Manifests) != 1 || idx.Manifests[0].MediaType != ocispec.MediaTypeImageManifest {
		t.Fatalf("index.json %s (%v): want one OCI image manifest", index, err)
	}
	raw, ok := blobs[string(idx.Manifests[0].Digest)]
	if !ok {
		t.Fatalf("no manifest blob %s among %d", idx.Manifests[0].Digest, len(blobs))
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil || m.MediaType != ocispec.MediaTypeImageManifest || len(m.Layers) == 0 {
		t.Fatalf("manifest %s (%v): want an OCI image manifest with layers", raw, err)
	}
	raw, ok = blobs[string(m.Config.Digest)]
	if !ok {
		t.Fatalf("no config blob %s", m.Config.Digest)
	}
	var config ocispec.Image
	if err := json.Unmarshal(raw, &config); err != nil {
		t.Fatal(err)
	}
	if config.OS != "linux" || config.Architecture != "amd64" ||
		!slices.ContainsFunc(config.History, func(h ocispec.History) bool { return strings.Contains(h.CreatedBy, "/runner --version") }) {
		t.Fatalf("config %s: want linux/amd64 with the RUN step in its history", raw)
	}
	for _, l := range m.Layers {
		if _, ok := blobs[string(l.Digest)]; !ok && large[string(l.Digest)] != l.Size {
			t.Errorf("layer %s (%d bytes) is not in the tarball (large blobs: %v)", l.Digest, l.Size, large)
		}
	}
	t.Logf("OCI tarball: manifest %s, %d layers, history %d entries", idx.Manifests[0].Digest, len(m.Layers), len(config.History))
}

func decodeBase64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// buildPodProblems lists what in the executor Pod p of a build pool differs from what README's
// security table says the build capability grants.
func buildPodProblems(p *corev1.Pod) []string {
	return sidecarPodProblems(p, pod.BuildContainer, corev1.EnvVar{Name: pod.EnvBuildKitHost, Value: pod.BuildKitHost}, false)
}

// sidecarPodProblems lists what in the executor Pod p differs from what README's security table
// says its capability grants: the sidecar named sidecar with SETUID and SETGID alone, the
// default Localhost profile, escalation allowed, non-root; every other container with no
// capability, RuntimeDefault and no escalation; no container privileged; env in the runner
// container; no hostPath volume but, for the docker sidecar, the node's tun device mounted by it
// alone, read-only; with userns, hostUsers false and the sidecar alone with an unmasked /proc,
// else neither.
func sidecarPodProblems(p *corev1.Pod, sidecar string, env corev1.EnvVar, userns bool) []string {
	var problems []string
	if got := p.Spec.HostUsers != nil && !*p.Spec.HostUsers; got != userns {
		problems = append(problems, fmt.Sprintf("hostUsers %v, want a user namespace: %v", p.Spec.HostUsers, userns))
	}
	podSeccomp := corev1.SeccompProfileTypeUnconfined
	if sc := p.Spec.SecurityContext; sc != nil && sc.SeccompProfile != nil {
		podSeccomp = sc.SeccompProfile.Type
	}
	hostPaths := map[string]bool{}
	for _, v := range p.Spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		hostPaths[v.Name] = true
		if sidecar != pod.DockerContainer || v.HostPath.Path != pod.TunDevice || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathCharDev {
			problems = append(problems, "hostPath volume "+v.Name+": "+v.HostPath.String())
		}
	}
	found := false
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		for _, m := range c.VolumeMounts {
			if hostPaths[m.Name] && (c.Name != pod.DockerContainer || !m.ReadOnly) {
				problems = append(problems, c.Name+": mounts the hostPath volume "+m.Name+" (read-only "+strconv.FormatBool(m.ReadOnly)+")")
			}
		}
		sc := c.SecurityContext
		if sc == nil {
			problems = append(problems, c.Name+": no securityContext")
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			problems = append(problems, c.Name+": privileged")
		}
		if unmasked := sc.ProcMount != nil && *sc.ProcMount == corev1.UnmaskedProcMount; unmasked != (userns && c.Name == sidecar) {
			problems = append(problems, fmt.Sprintf("%s: procMount %v", c.Name, sc.ProcMount))
		}
		seccomp, localhost := podSeccomp, ""
		if sc.SeccompProfile != nil {
			seccomp = sc.SeccompProfile.Type
			if sc.SeccompProfile.LocalhostProfile != nil {
				localhost = *sc.SeccompProfile.LocalhostProfile
			}
		}
		var added []corev1.Capability
		if sc.Capabilities != nil {
			added = sc.Capabilities.Add
			if !slices.Contains(sc.Capabilities.Drop, "ALL") {
				problems = append(problems, c.Name+": does not drop ALL capabilities")
			}
		}
		escalates := sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation
		if c.Name == sidecar {
			found = true
			if !slices.Equal(added, []corev1.Capability{"SETUID", "SETGID"}) || seccomp != corev1.SeccompProfileTypeLocalhost ||
				localhost != pod.DefaultBuildSeccompProfile || !escalates || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
				problems = append(problems, c.Name+": want SETUID and SETGID alone, Localhost "+pod.DefaultBuildSeccompProfile+
					", escalation allowed, non-root; got "+c.SecurityContext.String())
			}
			continue
		}
		if len(added) > 0 || seccomp != corev1.SeccompProfileTypeRuntimeDefault || escalates {
			problems = append(problems, c.Name+": want no capability, RuntimeDefault, no escalation; got "+c.SecurityContext.String())
		}
		if c.Name == pod.RunnerContainer && !slices.Contains(c.Env, env) {
			problems = append(problems, c.Name+": no "+env.Name+"="+env.Value)
		}
	}
	if !found {
		problems = append(problems, "no "+sidecar+" sidecar")
	}
	return problems
}

// buildAdmission creates, server-side dry run, the executor Pod p (as stored) changed three
// ways: first in a new namespace enforcing baseline alone, which admits each (the fault the
// policy is for), then in the executors' namespace, where deploy/admission's policy must
// refuse each with its message.
func (in *installation) buildAdmission(ctx context.Context, t *testing.T, p *corev1.Pod) {
	if p == nil {
		t.Fatal("no executor Pod from the Pod step")
	}
	const baselineOnly = "baseline-only"
	if _, err := in.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: baselineOnly, Labels: podSecurityBuild},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.c.WaitServiceAccount(ctx, t, baselineOnly)
	container := func(p *corev1.Pod, name string) *corev1.Container {
		for i := range p.Spec.InitContainers {
			if p.Spec.InitContainers[i].Name == name {
				return &p.Spec.InitContainers[i]
			}
		}
		for i := range p.Spec.Containers {
			if p.Spec.Containers[i].Name == name {
				return &p.Spec.Containers[i]
			}
		}
		t.Fatalf("no container %s in the executor Pod", name)
		return nil
	}
	for _, tc := range []struct {
		name, want string
		edit       func(p *corev1.Pod)
	}{
		{"the job's container adds SETUID", "every container of an executor Pod but the sidecars gdr-buildkit and gdr-docker is restricted", func(p *corev1.Pod) {
			c := container(p, pod.RunnerContainer)
			c.SecurityContext.Capabilities.Add = []corev1.Capability{"SETUID"}
		}},
		{"the sidecar adds DAC_OVERRIDE", "the sidecars gdr-buildkit and gdr-docker are not privileged, drop ALL capabilities and add none but SETUID and SETGID", func(p *corev1.Pod) {
			c := container(p, pod.BuildContainer)
			c.SecurityContext.Capabilities.Add = append(c.SecurityContext.Capabilities.Add, "DAC_OVERRIDE")
		}},
		{"the job's container runs as root", "every container of an executor Pod runs as non-root", func(p *corev1.Pod) {
			c := container(p, pod.RunnerContainer)
			c.SecurityContext.RunAsNonRoot, c.SecurityContext.RunAsUser = ptrTo(false), ptrTo(int64(0))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, ns := range []string{baselineOnly, jobsNamespace} {
				bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "admission-check", Namespace: ns}, Spec: *p.Spec.DeepCopy()}
				bad.Spec.NodeName = ""
				tc.edit(bad)
				_, err := in.cs.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				switch {
				case ns == baselineOnly && err != nil:
					t.Fatalf("Pod Security baseline alone refuses it, so the policy proves nothing here: %v", err)
				case ns == jobsNamespace && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("in %s: %v, want refused with %q", ns, err, tc.want)
				}
			}
		})
	}
}
