package deploy

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
)

// usesKubernetesAPI reports whether the function of p talks to the Kubernetes API: handle in job
// or http mode and recover, through the pod backend. Everything else (dispatch, the gateway,
// handle-setup, executors) must not even hold a ServiceAccount token.
func usesKubernetesAPI(p podTemplate) bool {
	switch p.function() {
	case "recover":
		return true
	case "handle":
		return p.env()["GDR_MODE"].Value != "setup"
	}
	return false
}

// hardeningProblems returns what p lacks of the hardened Pod baseline, one line per missing
// setting, naming the container. Container settings override the Pod's, as in Kubernetes.
func hardeningProblems(p podTemplate) []string {
	var probs []string
	add := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	spec := p.spec
	psc := spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		add("spec: hostNetwork, hostPID and hostIPC must be off")
	}
	switch mount := spec.AutomountServiceAccountToken; {
	case usesKubernetesAPI(p):
		if mount != nil && !*mount {
			add("spec.automountServiceAccountToken: false, but %s uses the Kubernetes API", p.function())
		}
	case mount == nil || *mount:
		add("spec.automountServiceAccountToken: want false (%s does not use the Kubernetes API)", p.function())
	}
	if p.pool != "" && (spec.EnableServiceLinks == nil || *spec.EnableServiceLinks) {
		add("spec.enableServiceLinks: want false in an executor")
	}
	tmpVolumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.EmptyDir != nil {
			tmpVolumes[v.Name] = true
		}
	}
	for _, c := range allContainers(spec) {
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		at := func(field string) string { return fmt.Sprintf("container %s: securityContext.%s", c.Name, field) }
		nonRoot := sc.RunAsNonRoot
		if nonRoot == nil {
			nonRoot = psc.RunAsNonRoot
		}
		if nonRoot == nil || !*nonRoot {
			add("%s: want true", at("runAsNonRoot"))
		}
		uid := sc.RunAsUser
		if uid == nil {
			uid = psc.RunAsUser
		}
		if uid == nil || *uid == 0 {
			add("%s: want a fixed non-zero user", at("runAsUser"))
		}
		gid := sc.RunAsGroup
		if gid == nil {
			gid = psc.RunAsGroup
		}
		if gid == nil || *gid == 0 {
			add("%s: want a fixed non-zero group", at("runAsGroup"))
		}
		seccomp := sc.SeccompProfile
		if seccomp == nil {
			seccomp = psc.SeccompProfile
		}
		if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			add("%s: want type RuntimeDefault", at("seccompProfile"))
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			add("%s: want false", at("allowPrivilegeEscalation"))
		}
		if sc.Privileged != nil && *sc.Privileged {
			add("%s: want false", at("privileged"))
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			add("%s: want true", at("readOnlyRootFilesystem"))
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			add("%s: want [ALL]", at("capabilities.drop"))
		}
		if sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
			add("%s: want none, have %v", at("capabilities.add"), sc.Capabilities.Add)
		}
		if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
			add("container %s: resources.limits.memory: missing", c.Name)
		}
		if _, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok {
			add("container %s: resources.requests.memory: missing", c.Name)
		}
		// The root filesystem is read-only: /tmp (os.TempDir, the runner's work directory) is
		// an emptyDir. The pod backend's init container only copies the runner into its own
		// volume (through a temporary file beside it): it needs no /tmp.
		if c.Name != pod.InstallContainer && !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return filepath.Clean(m.MountPath) == "/tmp" && tmpVolumes[m.Name]
		}) {
			add("container %s: volumeMounts: want an emptyDir at /tmp (the root filesystem is read-only)", c.Name)
		}
		for _, m := range c.VolumeMounts {
			for _, v := range spec.Volumes {
				if v.Name == m.Name && (v.HostPath != nil || v.Secret != nil || v.CSI != nil) && !m.ReadOnly {
					add("container %s: volumeMounts %s: want readOnly (hostPath, Secret or CSI volume)", c.Name, m.Name)
				}
			}
		}
	}
	return probs
}

// TestPodsHardened walks every Pod spec in every manifest, executor templates included, and
// names each object and missing setting of the hardened baseline.
func TestPodsHardened(t *testing.T) {
	tmpls := podTemplates(t, loadManifests(t))
	functions := map[string]int{}
	for _, p := range tmpls {
		functions[p.function()]++
		for _, prob := range hardeningProblems(p) {
			t.Errorf("%s: %s", p, prob)
		}
	}
	// The walk must have met every kind of Pod: 8 KEDA ones (handle-setup, handle-pod, dispatch,
	// recover x4: CronJob, the manual pass and status Jobs, finish ScaledJob; gateway), 3
	// Knative Services and the executor template.
	want := map[string]int{"handle": 3, "dispatch": 2, "recover": 5, "gateway": 1, "executor": 1}
	for f, n := range want {
		if functions[f] != n {
			t.Errorf("%d Pod templates run %s, want %d", functions[f], f, n)
		}
	}
}

// TestPoolsTemplateDocumentsRuntimeClass keeps the sandboxed-runtime knob in front of whoever
// edits the executor template.
func TestPoolsTemplateDocumentsRuntimeClass(t *testing.T) {
	d := one(t, installed(loadManifests(t), "keda"), "ConfigMap", "gdr-pools")
	data, _ := path(d.obj, "data", "pools.yaml").(string)
	if !strings.Contains(data, "# runtimeClassName:") || !strings.Contains(data, "gVisor") || !strings.Contains(data, "Kata") {
		t.Error("the executor template no longer documents runtimeClassName (gVisor runsc or Kata) for untrusted code")
	}
}

// TestHardeningCheckBites removes each setting in turn from a hardened template and expects
// hardeningProblems to name it.
func TestHardeningCheckBites(t *testing.T) {
	var base podTemplate
	for _, p := range podTemplates(t, installed(loadManifests(t), "keda")) {
		if p.doc.kind() == "Deployment" && p.doc.name() == "dispatch" {
			base = p
		}
	}
	if base.doc.obj == nil {
		t.Fatal("no dispatch Deployment")
	}
	if probs := hardeningProblems(base); len(probs) > 0 {
		t.Fatalf("the base is not hardened: %v", probs)
	}
	yes := true
	cases := map[string]func(s *corev1.PodSpec){
		"runAsNonRoot":             func(s *corev1.PodSpec) { s.SecurityContext.RunAsNonRoot = nil },
		"runAsUser":                func(s *corev1.PodSpec) { s.SecurityContext.RunAsUser = new(int64) },
		"runAsGroup":               func(s *corev1.PodSpec) { s.SecurityContext.RunAsGroup = nil },
		"seccompProfile":           func(s *corev1.PodSpec) { s.SecurityContext.SeccompProfile.Type = corev1.SeccompProfileTypeUnconfined },
		"allowPrivilegeEscalation": func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes },
		"readOnlyRootFilesystem":   func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.ReadOnlyRootFilesystem = nil },
		"capabilities.drop": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Capabilities.Drop = []corev1.Capability{"NET_RAW"}
		},
		"capabilities.add": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
		},
		"resources.limits.memory":      func(s *corev1.PodSpec) { delete(s.Containers[0].Resources.Limits, corev1.ResourceMemory) },
		"automountServiceAccountToken": func(s *corev1.PodSpec) { s.AutomountServiceAccountToken = nil },
		"/tmp": func(s *corev1.PodSpec) {
			s.Volumes = slices.DeleteFunc(s.Volumes, func(v corev1.Volume) bool { return v.EmptyDir != nil })
		},
		"container runAsUser 0": func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.RunAsUser = new(int64) // overrides the Pod's
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			p := base
			p.spec = *base.spec.DeepCopy()
			mutate(&p.spec)
			probs := hardeningProblems(p)
			want := strings.TrimSuffix(name, " 0")
			want = strings.TrimPrefix(want, "container ")
			if !slices.ContainsFunc(probs, func(s string) bool { return strings.Contains(s, want) }) {
				t.Fatalf("not caught; problems: %v", probs)
			}
		})
	}
}
