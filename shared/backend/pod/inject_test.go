package pod

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The values below are spelled out (not the package's constants) so that
// these tests say what a Pod must look like, independently of the code.
const (
	wantRunnerPath = "/gdr/bin/runner"
	wantInit       = "gdr-install-runner"
	wantSocket     = "unix:///spiffe-workload-api/spire-agent.sock"
)

// injected describes what a pool's Pod must carry for the runner and its SVID.
type injected struct {
	runnerImage string // the runner container's
	initImage   string
	env         string // SPIFFE_ENDPOINT_SOCKET
	csiDriver   string // "" with hostPath
	hostPath    string
	uid, gid    int64             // of the init container
	pullPolicy  corev1.PullPolicy // of the init container: the runner container's
}

// defaultPullPolicy is the API server's default imagePullPolicy for image:
// Always for the tag latest or none, else IfNotPresent.
func defaultPullPolicy(image string) corev1.PullPolicy {
	name := image[strings.LastIndex(image, "/")+1:]
	if i := strings.LastIndex(name, ":"); i < 0 || name[i+1:] == "latest" {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}

// checkInjected returns what pod lacks of want, one line each.
func checkInjected(pod *corev1.Pod, want injected) []string {
	var probs []string
	add := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	spec := pod.Spec
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	// The init container.
	if len(spec.InitContainers) != 1 {
		add("init containers: %d, want 1", len(spec.InitContainers))
		return probs
	}
	ic := spec.InitContainers[0]
	// Unset, it is what the API server defaults it to for its image (a Pod
	// read back from a real API server).
	if got := ic.ImagePullPolicy; got != want.pullPolicy && (want.pullPolicy != "" || got != defaultPullPolicy(ic.Image)) {
		add("init container imagePullPolicy %q, want the runner container's %q", got, want.pullPolicy)
	}
	if ic.Name != wantInit || ic.Image != want.initImage || len(ic.Command) != 0 ||
		!slices.Equal(ic.Args, []string{"install", wantRunnerPath}) {
		add("init container %s image %q command %q args %q; want %s image %q running its entrypoint with install %s",
			ic.Name, ic.Image, ic.Command, ic.Args, wantInit, want.initImage, wantRunnerPath)
	}
	binVolume := ""
	for _, m := range ic.VolumeMounts {
		if m.MountPath == "/gdr/bin" && !m.ReadOnly {
			binVolume = m.Name
		}
	}
	if v, ok := volumes[binVolume]; !ok || v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil {
		add("init container mounts %+v: want a size-limited emptyDir, writable, at /gdr/bin", ic.VolumeMounts)
	}
	sc := ic.SecurityContext
	switch {
	case sc == nil:
		add("init container: no securityContext")
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != want.uid ||
		sc.RunAsGroup == nil || *sc.RunAsGroup != want.gid:
		add("init container runs as nonRoot=%v %v:%v, want non-root %d:%d", sc.RunAsNonRoot, sc.RunAsUser, sc.RunAsGroup, want.uid, want.gid)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged == nil || *sc.Privileged:
		add("init container: privilege escalation or privileged allowed")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		add("init container: root filesystem writable")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		add("init container capabilities %+v, want drop ALL", sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		add("init container seccomp %+v, want RuntimeDefault", sc.SeccompProfile)
	}
	if ic.Resources.Limits.Memory().IsZero() || ic.Resources.Requests.Memory().IsZero() || ic.Resources.Requests.Cpu().IsZero() {
		add("init container resources %+v: want memory request and limit, cpu request", ic.Resources)
	}
	if len(ic.Env) != 0 || len(ic.EnvFrom) != 0 {
		add("init container env %v envFrom %v: want none (it copies a file)", ic.Env, ic.EnvFrom)
	}

	// The runner container.
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "runner" })
	if i < 0 {
		return append(probs, "no runner container")
	}
	c := spec.Containers[i]
	if c.Image != want.runnerImage {
		add("runner image %q, want %q", c.Image, want.runnerImage)
	}
	if !slices.Equal(c.Command, []string{wantRunnerPath}) || len(c.Args) != 0 {
		add("runner command %q args %q, want [%s]", c.Command, c.Args, wantRunnerPath)
	}
	var bin, spiffe *corev1.VolumeMount
	for j, m := range c.VolumeMounts {
		switch m.MountPath {
		case "/gdr/bin":
			bin = &c.VolumeMounts[j]
		case "/spiffe-workload-api":
			spiffe = &c.VolumeMounts[j]
		}
	}
	if bin == nil || bin.Name != binVolume || !bin.ReadOnly {
		add("runner mounts %+v: want the init container's emptyDir read-only at /gdr/bin", c.VolumeMounts)
	}
	if spiffe == nil || !spiffe.ReadOnly {
		add("runner mounts %+v: want the Workload API volume read-only at /spiffe-workload-api", c.VolumeMounts)
	} else {
		v := volumes[spiffe.Name]
		switch {
		case want.csiDriver != "" && (v.CSI == nil || v.CSI.Driver != want.csiDriver || v.CSI.ReadOnly == nil || !*v.CSI.ReadOnly):
			add("Workload API volume %+v: want the read-only CSI volume of %s", v.VolumeSource, want.csiDriver)
		case want.hostPath != "" && (v.HostPath == nil || v.HostPath.Path != want.hostPath || v.HostPath.Type == nil ||
			*v.HostPath.Type != corev1.HostPathDirectory):
			add("Workload API volume %+v: want the hostPath directory %s", v.VolumeSource, want.hostPath)
		}
	}
	n := 0
	for _, e := range c.Env {
		if e.Name == "SPIFFE_ENDPOINT_SOCKET" {
			n++
			if e.Value != want.env || e.ValueFrom != nil {
				add("runner SPIFFE_ENDPOINT_SOCKET=%q, want %q", e.Value, want.env)
			}
		}
	}
	if n != 1 {
		add("runner sets SPIFFE_ENDPOINT_SOCKET %d times, want once", n)
	}
	return probs
}

// TestInjection builds the Pod of a plain job and of a `container:` job for
// several profiles and checks the injected runner and Workload API.
func TestInjection(t *testing.T) {
	const hardened = `"securityContext":{"runAsNonRoot":true,"runAsUser":1000,"runAsGroup":2000}`
	for _, tc := range []struct {
		name     string
		profile  string
		jobImage string
		want     injected
	}{
		{
			name:    "plain job, defaults",
			profile: testTemplate,
			want: injected{runnerImage: "runner:v1", initImage: "runner:v1", env: wantSocket, csiDriver: "csi.spiffe.io",
				uid: 65532, gid: 65532},
		},
		{
			name:     "container job, defaults",
			profile:  testTemplate,
			jobImage: "node:22-bookworm",
			want: injected{runnerImage: "node:22-bookworm", initImage: "runner:v1", env: wantSocket, csiDriver: "csi.spiffe.io",
				uid: 65532, gid: 65532},
		},
		{
			name: "container job, runner image, Pod user",
			profile: `{"runnerImage":"gdr-runner:v2","podTemplate":{"spec":{` + hardened +
				`,"containers":[{"name":"runner","image":"gdr-runner-host:v2"}]}}}`,
			jobImage: "alpine:3",
			want: injected{runnerImage: "alpine:3", initImage: "gdr-runner:v2", env: wantSocket, csiDriver: "csi.spiffe.io",
				uid: 1000, gid: 2000},
		},
		{
			name: "root Pod: the init container stays non-root",
			profile: `{"podTemplate":{"spec":{"securityContext":{"runAsUser":0,"runAsGroup":0},` +
				`"containers":[{"name":"runner","image":"r:1","securityContext":{"runAsUser":0}}]}}}`,
			want: injected{runnerImage: "r:1", initImage: "r:1", env: wantSocket, csiDriver: "csi.spiffe.io", uid: 65532, gid: 65532},
		},
		{
			name: "runner container user wins over the Pod's",
			profile: `{"podTemplate":{"spec":{` + hardened +
				`,"containers":[{"name":"runner","image":"r:1","securityContext":{"runAsUser":3000}}]}}}`,
			want: injected{runnerImage: "r:1", initImage: "r:1", env: wantSocket, csiDriver: "csi.spiffe.io", uid: 3000, gid: 2000},
		},
		{
			name:    "other CSI driver and socket",
			profile: `{"workloadAPI":{"csiDriver":"spiffe.example.org","socket":"agent.sock"},` + testTemplate[1:],
			want: injected{runnerImage: "runner:v1", initImage: "runner:v1", env: "unix:///spiffe-workload-api/agent.sock",
				csiDriver: "spiffe.example.org", uid: 65532, gid: 65532},
		},
		{
			name:    "pull policy of the runner container",
			profile: `{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"r:1","imagePullPolicy":"IfNotPresent"}]}}}`,
			want: injected{runnerImage: "r:1", initImage: "r:1", env: wantSocket, csiDriver: "csi.spiffe.io", uid: 65532, gid: 65532,
				pullPolicy: corev1.PullIfNotPresent},
		},
		{
			name:     "hostPath",
			profile:  `{"workloadAPI":{"hostPath":"/run/spire/agent-sockets"},` + testTemplate[1:],
			jobImage: "golang:1.26",
			want: injected{runnerImage: "golang:1.26", initImage: "runner:v1", env: wantSocket,
				hostPath: "/run/spire/agent-sockets", uid: 65532, gid: 65532},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cfg := testConfig(t)
			client := fake.NewClientset()
			cfg.Client = client
			cfg.Pools[0].Profile = json.RawMessage(tc.profile)
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			a := testAssignment(t, 3, tc.jobImage)
			if _, err := b.Create(ctx, a, launch(cfg.Keys, a)); err != nil {
				t.Fatal(err)
			}
			pod, err := client.CoreV1().Pods("ci").Get(ctx, b.PodName(a.ID), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range checkInjected(pod, tc.want) {
				t.Error(p)
			}
			raw, _ := json.Marshal(pod)
			if strings.Contains(string(raw), secretValue) {
				t.Fatal("the Pod object holds a credential")
			}
		})
	}
}

// TestInjectionTemplateRules rejects profiles that collide with what the
// backend injects, naming the field.
func TestInjectionTemplateRules(t *testing.T) {
	keys := testKeys(t)
	tmpl := func(runner string, rest string) string {
		return `{"podTemplate":{"spec":{` + rest + `"containers":[{"name":"runner","image":"r:1"` + runner + `}]}}}`
	}
	for _, tc := range []struct{ name, profile, err string }{
		{"command", tmpl(`,"command":["/bin/sh"]`, ""), "spec.containers[runner].command, args: set by the backend"},
		{"args", tmpl(`,"args":["-v"]`, ""), "spec.containers[runner].command, args"},
		{"socket variable", tmpl(`,"env":[{"name":"SPIFFE_ENDPOINT_SOCKET","value":"unix:///x"}]`, ""), "SPIFFE_ENDPOINT_SOCKET is set by the backend"},
		{"mount at the runner dir", tmpl(`,"volumeMounts":[{"name":"x","mountPath":"/gdr/bin"}]`, `"volumes":[{"name":"x","emptyDir":{}}],`), "overlaps the backend's /gdr/bin"},
		{"mount above the socket dir", tmpl(`,"volumeMounts":[{"name":"x","mountPath":"/"}]`, `"volumes":[{"name":"x","emptyDir":{}}],`), "overlaps"},
		{"reserved volume", tmpl("", `"volumes":[{"name":"gdr-runner","emptyDir":{}}],`), "spec.volumes[gdr-runner]: the name is reserved"},
		{"reserved container", tmpl("", `"initContainers":[{"name":"gdr-install-runner","image":"x"}],`), `container name "gdr-install-runner" is reserved`},
		{"csi and hostPath", `{"workloadAPI":{"csiDriver":"csi.spiffe.io","hostPath":"/run/spire"},` + testTemplate[1:], "profile workloadAPI: csiDriver and hostPath are both set"},
		{"relative hostPath", `{"workloadAPI":{"hostPath":"run/spire"},` + testTemplate[1:], "hostPath \"run/spire\": want a clean absolute path"},
		{"unclean hostPath", `{"workloadAPI":{"hostPath":"/run/../spire"},` + testTemplate[1:], "want a clean absolute path"},
		{"bad driver", `{"workloadAPI":{"csiDriver":"CSI Driver"},` + testTemplate[1:], `csiDriver "CSI Driver"`},
		{"socket path", `{"workloadAPI":{"socket":"a/b.sock"},` + testTemplate[1:], `socket "a/b.sock": want a file name`},
		{"relative runner in image", `{"runnerInImage":"bin/runner",` + testTemplate[1:], `runnerInImage "bin/runner": want a clean absolute path`},
		{"unknown workloadAPI field", `{"workloadAPI":{"path":"/x"},` + testTemplate[1:], `unknown field "path"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseProfile(json.RawMessage(tc.profile), keys)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.err)
			}
		})
	}
	// Mounts beside the reserved ones are fine.
	ok := tmpl(`,"volumeMounts":[{"name":"x","mountPath":"/gdr/binaries"}]`, `"volumes":[{"name":"x","emptyDir":{}}],`)
	if _, err := ParseProfile(json.RawMessage(ok), keys); err != nil {
		t.Fatalf("a mount at /gdr/binaries: %v", err)
	}
}

// TestParseProfileInjectsOnce: the template the backend keeps is parsed and
// injected once; Pods of the pool do not accumulate injected parts.
func TestParseProfileInjectsOnce(t *testing.T) {
	ctx := context.Background()
	cfg, client, b := fakeBackend(t)
	for id := int64(1); id <= 3; id++ {
		a := testAssignment(t, id, "img:"+fmt.Sprint(id))
		if _, err := b.Create(ctx, a, launch(cfg.Keys, a)); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := client.CoreV1().Pods("ci").Get(ctx, "gdr-linux-3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 1 || len(pod.Spec.Volumes) != 2 || len(pod.Spec.Containers[0].VolumeMounts) != 2 ||
		len(pod.Spec.Containers[0].Env) != 1 {
		t.Fatalf("third Pod: %d init containers, %d volumes, runner mounts %v env %v",
			len(pod.Spec.InitContainers), len(pod.Spec.Volumes), pod.Spec.Containers[0].VolumeMounts, pod.Spec.Containers[0].Env)
	}
}

// TestExecutorPodsAreNotTheAutoscalersToEvict: every executor Pod tells the
// cluster autoscaler it is not safe to evict, also where its pool's template
// says otherwise (a running job cannot move).
func TestExecutorPodsAreNotTheAutoscalersToEvict(t *testing.T) {
	ctx := context.Background()
	cfg, client, b := fakeBackend(t)
	for name, tp := range b.pools {
		tp.template.Annotations = map[string]string{SafeToEvict: "true", "team": "ci"}
		b.pools[name] = tp
	}
	a := testAssignment(t, 1, "")
	if _, err := b.Create(ctx, a, launch(cfg.Keys, a)); err != nil {
		t.Fatal(err)
	}
	pod, err := client.CoreV1().Pods("ci").Get(ctx, "gdr-linux-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Annotations[SafeToEvict]; got != "false" || pod.Annotations["team"] != "ci" {
		t.Fatalf("executor Pod annotations %v: want %s \"false\" beside the template's own", pod.Annotations, SafeToEvict)
	}
}

// fakeBackend is a Backend of testConfig over a fake clientset, with both.
func fakeBackend(t *testing.T) (Config, *fake.Clientset, *Backend) {
	t.Helper()
	cfg := testConfig(t)
	client := fake.NewClientset()
	cfg.Client = client
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, client, b
}
