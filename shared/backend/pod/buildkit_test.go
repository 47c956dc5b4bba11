package pod

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

const buildTemplate = `"podTemplate":{"spec":{"containers":[{"name":"runner","image":"r:1","imagePullPolicy":"IfNotPresent"}]}}`

// TestBuildCapability: a pool with build gets, in both of its templates (a
// job in its own image, a job in the runner's), the sidecar exactly as
// BuildKit documents it (no other capability, never privileged, the
// Localhost profile) and BUILDKIT_HOST in the runner container; without
// build, nothing of it.
func TestBuildCapability(t *testing.T) {
	keys := testKeys(t)
	for _, tc := range []struct {
		name, build string
		profile     string // want the sidecar's Localhost profile; empty: no sidecar
		cache       string
	}{
		{name: "off", build: ""},
		{name: "defaults", build: `"build":{"image":"bk:1"},`, profile: "gdr/buildkit.json", cache: "10Gi"},
		{name: "set", build: `"build":{"image":"bk:1","seccompProfile":"ops/bk-v2.json","cacheSize":"2Gi"},`,
			profile: "ops/bk-v2.json", cache: "2Gi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, err := parseProfile(json.RawMessage(`{"runnerInImage":"/usr/local/bin/runner",`+tc.build+buildTemplate+`}`), keys, false)
			if err != nil {
				t.Fatal(err)
			}
			for which, tmpl := range map[string]corev1.PodTemplateSpec{"install": ts.install, "direct": *ts.direct} {
				spec := tmpl.Spec
				runner := spec.Containers[runnerIndex(spec.Containers)]
				i := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == BuildContainer })
				hasHost := slices.ContainsFunc(runner.Env, func(e corev1.EnvVar) bool { return e.Name == EnvBuildKitHost && e.Value == BuildKitHost })
				if tc.profile == "" {
					if i >= 0 || hasHost || spec.HostUsers != nil {
						t.Fatalf("%s: a pool without build got some of it: %+v", which, spec)
					}
					continue
				}
				if i < 0 || !hasHost {
					t.Fatalf("%s: sidecar at %d, BUILDKIT_HOST %v: %+v", which, i, hasHost, spec)
				}
				checkSidecar(t, which, spec.InitContainers[i], "bk:1", tc.profile)
				state := spec.Volumes[slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == buildStateVolume })]
				if want := resource.MustParse(tc.cache); state.EmptyDir == nil || state.EmptyDir.SizeLimit.Cmp(want) != 0 {
					t.Errorf("%s: state volume %+v, want an emptyDir of %s", which, state, tc.cache)
				}
				m := runner.VolumeMounts[slices.IndexFunc(runner.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == buildSocketVolume })]
				if m.MountPath != BuildSocketDir || !m.ReadOnly {
					t.Errorf("%s: runner's socket mount %+v, want read-only at %s", which, m, BuildSocketDir)
				}
				if spec.HostUsers != nil {
					t.Errorf("%s: hostUsers %v, want unset", which, *spec.HostUsers)
				}
			}
		})
	}
}

// TestBuildCapabilityRules: bad build settings and templates that collide
// with what the capability adds are refused, naming the field.
func TestBuildCapabilityRules(t *testing.T) {
	keys := testKeys(t)
	runner := func(extra string) string {
		return `"podTemplate":{"spec":{"containers":[{"name":"runner","image":"r:1"` + extra + `}]}}`
	}
	for _, tc := range []struct{ name, profile, err string }{
		{"no image", `{"build":{},` + buildTemplate + `}`, "profile build: image: empty"},
		{"absolute profile", `{"build":{"image":"b","seccompProfile":"/var/lib/kubelet/seccomp/x.json"},` + buildTemplate + `}`, `seccompProfile "/var/lib/kubelet/seccomp/x.json": want a clean path relative`},
		{"escaping profile", `{"build":{"image":"b","seccompProfile":"../x.json"},` + buildTemplate + `}`, `seccompProfile "../x.json"`},
		{"bad cache", `{"build":{"image":"b","cacheSize":"big"},` + buildTemplate + `}`, `cacheSize "big": want a positive quantity`},
		{"unknown field", `{"build":{"image":"b","privileged":true},` + buildTemplate + `}`, `unknown field "privileged"`},
		{"no user namespace setting yet", `{"build":{"image":"b","userNamespace":true},` + buildTemplate + `}`, `unknown field "userNamespace"`},
		{"BUILDKIT_HOST", `{` + runner(`,"env":[{"name":"BUILDKIT_HOST","value":"tcp://x:1"}]`) + `}`, "BUILDKIT_HOST is set by the build capability"},
		{"socket mount", `{"podTemplate":{"spec":{"volumes":[{"name":"x","emptyDir":{}}],"containers":[{"name":"runner","image":"r:1","volumeMounts":[{"name":"x","mountPath":"/run"}]}]}}}`, "overlaps the build capability's /run/buildkit"},
		{"sidecar name", `{"podTemplate":{"spec":{"initContainers":[{"name":"gdr-buildkit","image":"x"}],"containers":[{"name":"runner","image":"r:1"}]}}}`, `container name "gdr-buildkit" is reserved`},
		{"volume name", `{"podTemplate":{"spec":{"volumes":[{"name":"gdr-buildkit-state","emptyDir":{}}],"containers":[{"name":"runner","image":"r:1"}]}}}`, "spec.volumes[gdr-buildkit-state]: the prefix gdr-buildkit is reserved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseProfile(json.RawMessage(tc.profile), keys)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.err)
			}
		})
	}
}

// buildPool is a pool profile with the build capability and settings
// (JSON members after the image, or "").
func buildPool(settings string) json.RawMessage {
	return json.RawMessage(`{"build":{"image":"bk:1"` + settings + `},` + buildTemplate + `}`)
}

// TestBuildResources: the sidecar of every Pod of a build pool is bounded. A
// pool that sets no resources gets the defaults (memory 4Gi requested and
// limited, CPU 250m requested and 2 limited); a pool that sets some gets
// those, the others defaulted (a memory request follows the memory limit, a
// CPU request is at most the CPU limit); other resources pass as set.
func TestBuildResources(t *testing.T) {
	ctx := context.Background()
	type rl = map[corev1.ResourceName]string
	for _, tc := range []struct {
		name, settings string
		requests       rl
		limits         rl
	}{
		{name: "none", settings: "",
			requests: rl{"cpu": "250m", "memory": "4Gi"}, limits: rl{"cpu": "2", "memory": "4Gi"}},
		{name: "empty", settings: `,"resources":{}`,
			requests: rl{"cpu": "250m", "memory": "4Gi"}, limits: rl{"cpu": "2", "memory": "4Gi"}},
		{name: "raised", settings: `,"resources":{"requests":{"cpu":"2","memory":"12Gi"},"limits":{"cpu":"4","memory":"12Gi"}}`,
			requests: rl{"cpu": "2", "memory": "12Gi"}, limits: rl{"cpu": "4", "memory": "12Gi"}},
		{name: "memory limit alone", settings: `,"resources":{"limits":{"memory":"8Gi"}}`,
			requests: rl{"cpu": "250m", "memory": "8Gi"}, limits: rl{"cpu": "2", "memory": "8Gi"}},
		{name: "lowered", settings: `,"resources":{"limits":{"cpu":"100m","memory":"1Gi"}}`,
			requests: rl{"cpu": "100m", "memory": "1Gi"}, limits: rl{"cpu": "100m", "memory": "1Gi"}},
		{name: "requests alone", settings: `,"resources":{"requests":{"cpu":1,"memory":"2Gi"}}`,
			requests: rl{"cpu": "1", "memory": "2Gi"}, limits: rl{"cpu": "2", "memory": "4Gi"}},
		{name: "another resource", settings: `,"resources":{"limits":{"ephemeral-storage":"1Gi"}}`,
			requests: rl{"cpu": "250m", "memory": "4Gi"}, limits: rl{"cpu": "2", "memory": "4Gi", "ephemeral-storage": "1Gi"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			client := fake.NewClientset()
			cfg.Client = client
			cfg.Pools[0].Profile = buildPool(tc.settings)
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			a := testAssignment(t, 21, "")
			if _, err := b.Create(ctx, a, launch(cfg.Keys, a)); err != nil {
				t.Fatal(err)
			}
			pod, err := client.CoreV1().Pods("ci").Get(ctx, b.PodName(a.ID), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == BuildContainer })
			if i < 0 {
				t.Fatalf("no %s in %+v", BuildContainer, pod.Spec.InitContainers)
			}
			got := pod.Spec.InitContainers[i].Resources
			for which, pair := range map[string]struct {
				got  corev1.ResourceList
				want rl
			}{"requests": {got.Requests, tc.requests}, "limits": {got.Limits, tc.limits}} {
				if len(pair.got) != len(pair.want) {
					t.Errorf("%s %v, want %v", which, pair.got, pair.want)
				}
				for name, want := range pair.want {
					if q, ok := pair.got[name]; !ok || q.Cmp(resource.MustParse(want)) != 0 {
						t.Errorf("%s.%s = %v (set: %v), want %s", which, name, q.String(), ok, want)
					}
				}
			}
		})
	}
}

// TestBuildResourcesRefused: a pool that would leave its build sidecar
// unbounded (a limit or request written empty, null or zero or negative) or
// whose requests exceed its limits, its own or the defaults, is refused
// when the backend reads it, naming the pool and the field.
func TestBuildResourcesRefused(t *testing.T) {
	for _, tc := range []struct{ name, settings, err string }{
		{"empty memory limit", `,"resources":{"limits":{"memory":""}}`,
			`pool "linux": profile build: resources.limits.memory: "" is not a quantity`},
		{"null memory limit", `,"resources":{"limits":{"memory":null}}`,
			`pool "linux": profile build: resources.limits.memory: empty; set a positive quantity (default 4Gi) or leave it out for the default`},
		{"zero cpu limit", `,"resources":{"limits":{"cpu":0}}`,
			`pool "linux": profile build: resources.limits.cpu: 0 is not positive; set a positive quantity (default 2) or leave it out for the default`},
		{"zero memory limit as text", `,"resources":{"limits":{"memory":"0"}}`,
			`pool "linux": profile build: resources.limits.memory: 0 is not positive`},
		{"negative cpu limit", `,"resources":{"limits":{"cpu":"-1"}}`,
			`pool "linux": profile build: resources.limits.cpu: -1 is not positive`},
		{"zero cpu request", `,"resources":{"requests":{"cpu":"0"}}`,
			`pool "linux": profile build: resources.requests.cpu: 0 is not positive; set a positive quantity (default 250m) or leave it out for the default`},
		{"empty ephemeral-storage limit", `,"resources":{"limits":{"ephemeral-storage":""}}`,
			`pool "linux": profile build: resources.limits.ephemeral-storage: "" is not a quantity`},
		{"request above its limit", `,"resources":{"requests":{"memory":"8Gi"},"limits":{"memory":"6Gi"}}`,
			`pool "linux": profile build: resources.requests.memory: 8Gi is above resources.limits.memory 6Gi`},
		{"request above the default limit", `,"resources":{"requests":{"memory":"8Gi"}}`,
			`pool "linux": profile build: resources.requests.memory: 8Gi is above resources.limits.memory 4Gi (the default); set resources.limits.memory too`},
		{"claims", `,"resources":{"claims":[{"name":"x"}]}`, `unknown field "claims"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Pools[0].Profile = buildPool(tc.settings)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.err)
			}
		})
	}
	// As an operator writes it: a YAML pools file whose memory limit has
	// no value.
	t.Run("pools file", func(t *testing.T) {
		pools, err := runnerpool.Parse([]byte(`pools:
- name: builds
  labels: [build]
  backend: pod
  capacity: 1
  profile:
    build:
      image: bk:1
      resources:
        limits:
          memory:
    podTemplate: {spec: {containers: [{name: runner, image: r:1}]}}
`), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(t)
		cfg.Pools = pools
		_, err = New(cfg)
		if want := `pool "builds": profile build: resources.limits.memory: empty`; err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("err = %v, want it to contain %q", err, want)
		}
	})
}

// checkSidecar: c is a capability's sidecar as sidecarSecurity makes it
// (65532, SETUID and SETGID alone, never privileged, the Localhost profile,
// a read-only root), a native sidecar running image with its own entrypoint,
// pulled as the runner's, bounded, with a startup probe.
func checkSidecar(t *testing.T, which string, c corev1.Container, image, profile string) {
	t.Helper()
	sc := c.SecurityContext
	switch {
	case c.Image != image || c.ImagePullPolicy != corev1.PullIfNotPresent || c.Command != nil || c.Args != nil:
		t.Errorf("%s: image %s %s %v %v, want %s pulled as the runner's, its own entrypoint", which, c.Image, c.ImagePullPolicy, c.Command, c.Args, image)
	case c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways:
		t.Errorf("%s: not a native sidecar: %v", which, c.RestartPolicy)
	case sc == nil || sc.Privileged == nil || *sc.Privileged || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || *sc.RunAsUser != 65532:
		t.Errorf("%s: privileged or root: %+v", which, sc)
	case !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SETUID", "SETGID"}):
		t.Errorf("%s: capabilities %+v, want ALL dropped and SETUID, SETGID alone added", which, sc.Capabilities)
	case sc.SeccompProfile.Type != corev1.SeccompProfileTypeLocalhost || *sc.SeccompProfile.LocalhostProfile != profile:
		t.Errorf("%s: seccomp %+v, want Localhost %s", which, sc.SeccompProfile, profile)
	case !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: writable root", which)
	case c.StartupProbe == nil:
		t.Errorf("%s: no startup probe: the first step could find no daemon", which)
	case c.Resources.Limits.Memory().IsZero() || c.Resources.Limits.Cpu().IsZero():
		t.Errorf("%s: unbounded: %+v", which, c.Resources)
	}
}
