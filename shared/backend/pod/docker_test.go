package pod

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

const dockerTemplate = `"podTemplate":{"spec":{"volumes":[{"name":"tmp","emptyDir":{}}],"containers":[{"name":"runner","image":"r:1","imagePullPolicy":"IfNotPresent","volumeMounts":[{"name":"tmp","mountPath":"/tmp"}]}]}}`

// TestDockerCapability: a pool with docker gets, in both of its templates,
// the sidecar exactly as Docker documents it (no capability but SETUID and
// SETGID, never privileged, the Localhost profile, the node's TUN device and
// the runner's work volume at the runner's path) and DOCKER_HOST in the
// runner container; without docker, nothing of it.
func TestDockerCapability(t *testing.T) {
	keys := testKeys(t)
	for _, tc := range []struct {
		name, docker string
		profile      string // want the sidecar's Localhost profile; empty: no sidecar
		storage      string
		userns       bool // want hostUsers false and the sidecar's /proc unmasked
	}{
		{name: "off", docker: ""},
		{name: "defaults", docker: `"docker":{"image":"dk:1"},`, profile: "gdr/buildkit.json", storage: "20Gi"},
		{name: "set", docker: `"docker":{"image":"dk:1","seccompProfile":"ops/dk.json","storageSize":"5Gi"},`, profile: "ops/dk.json", storage: "5Gi"},
		{name: "user namespace", docker: `"docker":{"image":"dk:1","userNamespace":true},`, profile: "gdr/buildkit.json", storage: "20Gi", userns: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, err := parseProfile(json.RawMessage(`{"runnerInImage":"/usr/local/bin/runner",`+tc.docker+dockerTemplate+`}`), keys, false)
			if err != nil {
				t.Fatal(err)
			}
			for which, tmpl := range map[string]corev1.PodTemplateSpec{"install": ts.install, "direct": *ts.direct} {
				spec := tmpl.Spec
				runner := spec.Containers[runnerIndex(spec.Containers)]
				i := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == DockerContainer })
				hasHost := slices.ContainsFunc(runner.Env, func(e corev1.EnvVar) bool { return e.Name == EnvDockerHost && e.Value == DockerHost })
				hasTun := slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil })
				if tc.profile == "" {
					if i >= 0 || hasHost || hasTun {
						t.Fatalf("%s: a pool without docker got some of it: %+v", which, spec)
					}
					continue
				}
				if i < 0 || !hasHost {
					t.Fatalf("%s: sidecar at %d, DOCKER_HOST %v: %+v", which, i, hasHost, spec)
				}
				c := spec.InitContainers[i]
				checkSidecar(t, which, c, "dk:1", tc.profile)
				// The user namespace: the Pod's, and the sidecar alone unmasks its /proc.
				userns := spec.HostUsers != nil && !*spec.HostUsers
				unmasked := c.SecurityContext.ProcMount != nil && *c.SecurityContext.ProcMount == corev1.UnmaskedProcMount
				told := slices.Contains(c.Env, corev1.EnvVar{Name: EnvDockerUserNamespace, Value: strconv.FormatBool(tc.userns)})
				if userns != tc.userns || unmasked != tc.userns || !told {
					t.Errorf("%s: hostUsers %v, sidecar procMount %v, %s told %v; want a user namespace: %v", which,
						spec.HostUsers, c.SecurityContext.ProcMount, EnvDockerUserNamespace, told, tc.userns)
				}
				for _, other := range append(slices.Clone(spec.Containers), spec.InitContainers...) {
					if other.Name != DockerContainer && other.SecurityContext != nil && other.SecurityContext.ProcMount != nil {
						t.Errorf("%s: container %s sets procMount %s", which, other.Name, *other.SecurityContext.ProcMount)
					}
				}
				mounts := map[string]corev1.VolumeMount{}
				for _, m := range c.VolumeMounts {
					mounts[m.Name] = m
				}
				if m := mounts["tmp"]; m.MountPath != "/tmp" || m.ReadOnly {
					t.Errorf("%s: sidecar's work mount %+v, want the runner's tmp at /tmp, writable", which, m)
				}
				if m := mounts[dockerTunVolume]; m.MountPath != TunDevice || !m.ReadOnly {
					t.Errorf("%s: sidecar's TUN mount %+v, want %s read-only (the admission policy's exception)", which, m, TunDevice)
				}
				for _, v := range spec.Volumes {
					if v.HostPath != nil && (v.Name != dockerTunVolume || v.HostPath.Path != TunDevice || *v.HostPath.Type != corev1.HostPathCharDev) {
						t.Errorf("%s: hostPath volume %+v, want %s (CharDevice) alone", which, v, TunDevice)
					}
				}
				for _, other := range append(slices.Clone(spec.Containers), spec.InitContainers...) {
					if other.Name == DockerContainer {
						continue
					}
					for _, m := range other.VolumeMounts {
						if m.Name == dockerTunVolume {
							t.Errorf("%s: container %s mounts the TUN device", which, other.Name)
						}
					}
				}
				state := spec.Volumes[slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == dockerStateVolume })]
				if want := resource.MustParse(tc.storage); state.EmptyDir == nil || state.EmptyDir.SizeLimit.Cmp(want) != 0 {
					t.Errorf("%s: state volume %+v, want an emptyDir of %s", which, state, tc.storage)
				}
				m := runner.VolumeMounts[slices.IndexFunc(runner.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == dockerSocketVolume })]
				if m.MountPath != DockerSocketDir || !m.ReadOnly {
					t.Errorf("%s: runner's socket mount %+v, want read-only at %s", which, m, DockerSocketDir)
				}
			}
		})
	}
}

// TestDockerCapabilityRules: bad docker settings and templates that collide
// with what the capability adds, or give it no work volume, are refused,
// naming the field.
func TestDockerCapabilityRules(t *testing.T) {
	keys := testKeys(t)
	runner := func(extra string) string {
		return `"podTemplate":{"spec":{"containers":[{"name":"runner","image":"r:1"` + extra + `}]}}`
	}
	for _, tc := range []struct{ name, profile, err string }{
		{"no image", `{"docker":{},` + dockerTemplate + `}`, "profile docker: image: empty"},
		{"absolute profile", `{"docker":{"image":"d","seccompProfile":"/x.json"},` + dockerTemplate + `}`, `seccompProfile "/x.json": want a clean path relative`},
		{"bad storage", `{"docker":{"image":"d","storageSize":"big"},` + dockerTemplate + `}`, `storageSize "big": want a positive quantity`},
		{"zero memory", `{"docker":{"image":"d","resources":{"limits":{"memory":"0"}}},` + dockerTemplate + `}`, "resources.limits.memory: 0 is not positive"},
		{"unknown field", `{"docker":{"image":"d","privileged":true},` + dockerTemplate + `}`, `unknown field "privileged"`},
		{"no work volume", `{"docker":{"image":"d"},` + runner("") + `}`, "work folder /tmp/gitea-dynamic-runner is on no writable volume"},
		{"work volume elsewhere", `{"docker":{"image":"d"},"podTemplate":{"spec":{"volumes":[{"name":"w","emptyDir":{}}],"containers":[{"name":"runner","image":"r:1","env":[{"name":"GDR_WORK_DIR","value":"/work/gdr"}],"volumeMounts":[{"name":"w","mountPath":"/tmp"}]}]}}}`, "work folder /work/gdr is on no writable volume"},
		{"DOCKER_HOST", `{` + runner(`,"env":[{"name":"DOCKER_HOST","value":"tcp://x:2375"}]`) + `}`, "DOCKER_HOST is set by the docker capability"},
		{"socket mount", `{"podTemplate":{"spec":{"volumes":[{"name":"x","emptyDir":{}}],"containers":[{"name":"runner","image":"r:1","volumeMounts":[{"name":"x","mountPath":"/run/docker-socket/x"}]}]}}}`, "overlaps the docker capability's /run/docker-socket"},
		{"sidecar name", `{"podTemplate":{"spec":{"initContainers":[{"name":"gdr-docker","image":"x"}],"containers":[{"name":"runner","image":"r:1"}]}}}`, `container name "gdr-docker" is reserved`},
		{"user namespace refused by the template", `{"docker":{"image":"d","userNamespace":true},"podTemplate":{"spec":{"hostUsers":true,"volumes":[{"name":"tmp","emptyDir":{}}],"containers":[{"name":"runner","image":"r:1","volumeMounts":[{"name":"tmp","mountPath":"/tmp"}]}]}}}`, "userNamespace: the podTemplate sets hostUsers: true"},
		{"volume name", `{"podTemplate":{"spec":{"volumes":[{"name":"gdr-docker-tun","emptyDir":{}}],"containers":[{"name":"runner","image":"r:1"}]}}}`, "spec.volumes[gdr-docker-tun]: the prefix gdr-docker is reserved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseProfile(json.RawMessage(tc.profile), keys)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.err)
			}
		})
	}
}
