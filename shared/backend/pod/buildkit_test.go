package pod

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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
				c := spec.InitContainers[i]
				sc := c.SecurityContext
				switch {
				case c.Image != "bk:1" || c.ImagePullPolicy != corev1.PullIfNotPresent:
					t.Errorf("%s: image %s %s, want bk:1 pulled as the runner's", which, c.Image, c.ImagePullPolicy)
				case c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways:
					t.Errorf("%s: not a native sidecar: %v", which, c.RestartPolicy)
				case sc == nil || sc.Privileged == nil || *sc.Privileged || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || *sc.RunAsUser != 65532:
					t.Errorf("%s: privileged or root: %+v", which, sc)
				case !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SETUID", "SETGID"}):
					t.Errorf("%s: capabilities %+v, want ALL dropped and SETUID, SETGID alone added", which, sc.Capabilities)
				case sc.SeccompProfile.Type != corev1.SeccompProfileTypeLocalhost || *sc.SeccompProfile.LocalhostProfile != tc.profile:
					t.Errorf("%s: seccomp %+v, want Localhost %s", which, sc.SeccompProfile, tc.profile)
				case !*sc.ReadOnlyRootFilesystem:
					t.Errorf("%s: writable root", which)
				case c.StartupProbe == nil:
					t.Errorf("%s: no startup probe: the first step could find no buildkitd", which)
				}
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
