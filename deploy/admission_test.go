package deploy

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/generic"
	"k8s.io/apiserver/pkg/admission/plugin/policy/matching"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
)

// admissionFile is the executors' admission policy for build pools (deploy/README.md, "Image
// builds"), applied by kubectl apply -f.
const admissionFile = "admission/executors-build.yaml"

// admissionObjects are the objects of admissionFile: the policy, its binding and, when the
// binding takes parameters, the ConfigMap it names (nil otherwise).
type admissionObjects struct {
	policy  *admissionregistrationv1.ValidatingAdmissionPolicy
	binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	params  *corev1.ConfigMap
}

// loadAdmission reads admissionFile, with the defaults the API server gives what it leaves
// out (the API's documented defaults: empty selectors match everything, matchPolicy
// Equivalent, a rule's scope "*"), as the policy plugin sees the stored objects.
func loadAdmission(t *testing.T) admissionObjects {
	t.Helper()
	data, err := os.ReadFile(admissionFile)
	if err != nil {
		t.Fatal(err)
	}
	raws, err := splitDocs(data)
	if err != nil {
		t.Fatalf("%s: %v", admissionFile, err)
	}
	var out admissionObjects
	for _, raw := range raws {
		var head metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &head); err != nil {
			t.Fatalf("%s: %v", admissionFile, err)
		}
		var into any
		switch head.Kind {
		case "ValidatingAdmissionPolicy":
			out.policy = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			into = out.policy
		case "ValidatingAdmissionPolicyBinding":
			out.binding = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			into = out.binding
		case "ConfigMap":
			out.params = &corev1.ConfigMap{}
			into = out.params
		default:
			t.Fatalf("%s: unexpected %s", admissionFile, head.Kind)
		}
		if err := yaml.UnmarshalStrict(raw, into); err != nil {
			t.Fatalf("%s: %s: %v", admissionFile, head.Kind, err)
		}
	}
	if out.policy == nil || out.binding == nil {
		t.Fatalf("%s: want a ValidatingAdmissionPolicy and its binding", admissionFile)
	}
	defaultMatch := func(m *admissionregistrationv1.MatchResources) {
		if m.NamespaceSelector == nil {
			m.NamespaceSelector = &metav1.LabelSelector{}
		}
		if m.ObjectSelector == nil {
			m.ObjectSelector = &metav1.LabelSelector{}
		}
		if m.MatchPolicy == nil {
			equivalent := admissionregistrationv1.Equivalent
			m.MatchPolicy = &equivalent
		}
		for i := range m.ResourceRules {
			if m.ResourceRules[i].Scope == nil {
				all := admissionregistrationv1.AllScopes
				m.ResourceRules[i].Scope = &all
			}
		}
	}
	defaultMatch(out.policy.Spec.MatchConstraints)
	if out.binding.Spec.MatchResources != nil {
		defaultMatch(out.binding.Spec.MatchResources)
	}
	return out
}

// compileAdmissionPolicy compiles a ValidatingAdmissionPolicy as the API server's plugin does
// (k8s.io/apiserver's CEL compiler and validator, the composition environment with its strict
// cost), for the parts the shipped policy uses: variables and validations with messages. A
// policy using anything else fails the test, so that this never judges a policy it cannot read.
func compileAdmissionPolicy(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy) validating.Validator {
	t.Helper()
	if len(p.Spec.MatchConditions) > 0 || len(p.Spec.AuditAnnotations) > 0 {
		t.Fatalf("%s: matchConditions or auditAnnotations: extend compileAdmissionPolicy", p.Name)
	}
	for _, v := range p.Spec.Validations {
		if v.MessageExpression != "" {
			t.Fatalf("%s: a messageExpression: extend compileAdmissionPolicy", p.Name)
		}
	}
	hasParams := p.Spec.ParamKind != nil
	vars := plugincel.OptionalVariableDeclarations{HasParams: hasParams, HasAuthorizer: true}
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	named := make([]plugincel.NamedExpressionAccessor, len(p.Spec.Variables))
	for i, v := range p.Spec.Variables {
		named[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(named, vars, environment.StoredExpressions)
	conditions := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		conditions[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
	}
	messages := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	v := validating.NewValidator(
		compiler.CompileCondition(conditions, vars, environment.StoredExpressions),
		nil,
		compiler.CompileCondition(nil, vars, environment.StoredExpressions),
		compiler.CompileCondition(messages, plugincel.OptionalVariableDeclarations{HasParams: hasParams}, environment.StoredExpressions),
		p.Spec.FailurePolicy, nil)
	if err := v.CompileError(); err != nil {
		t.Fatalf("%s does not compile: %v", p.Name, err)
	}
	return v
}

// admissionPlane is the API server's ValidatingAdmissionPolicy plugin (k8s.io/apiserver's own
// policy test context: its real policy source, matcher, parameter resolution and dispatcher,
// over client-go's fake clients) with admissionFile's objects loaded.
type admissionPlane struct {
	ctx *generic.PolicyTestContext[*validating.Policy, *validating.PolicyBinding, validating.Validator]
}

// startAdmission starts the plugin with objs (params may be nil: not created) and the
// namespaces the tests use.
func startAdmission(t *testing.T, objs admissionObjects) admissionPlane {
	t.Helper()
	var initial []runtime.Object
	for _, ns := range []string{jobsNamespace, "elsewhere"} {
		initial = append(initial, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: namespaceLabels(ns)}})
	}
	t.Cleanup(generic.SetPolicyRefreshIntervalForTests(10 * time.Millisecond))
	ctx, cancel, err := generic.NewPolicyTestContext(t,
		validating.NewValidatingAdmissionPolicyAccessor,
		validating.NewValidatingAdmissionPolicyBindingAccessor,
		func(p *validating.Policy) validating.Validator { return compileAdmissionPolicy(t, p) },
		func(a authorizer.UnconditionalAuthorizer, m *matching.Matcher, _ kubernetes.Interface) generic.Dispatcher[validating.PolicyHook] {
			return validating.NewDispatcher(a, generic.NewPolicyMatcher(m))
		},
		initial, []meta.RESTMapping{{ // the namespaces above; ConfigMaps it maps itself
			Resource: corev1.SchemeGroupVersion.WithResource("namespaces"), GroupVersionKind: corev1.SchemeGroupVersion.WithKind("Namespace"),
			Scope: meta.RESTScopeRoot,
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	if err := ctx.Start(); err != nil {
		t.Fatal(err)
	}
	// Without their TypeMeta the harness files them as its policy and binding kinds.
	policy, binding := objs.policy.DeepCopy(), objs.binding.DeepCopy()
	policy.TypeMeta, binding.TypeMeta = metav1.TypeMeta{}, metav1.TypeMeta{}
	if err := ctx.UpdateAndWait(policy, binding); err != nil {
		t.Fatal(err)
	}
	if objs.params != nil {
		// A ConfigMap parameter is read through the typed informers, from the fake clientset.
		if err := ctx.UpdateAndWait(objs.params.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	return admissionPlane{ctx: ctx}
}

// admit asks the plugin about p: created (old nil), or updated from old through subresource
// ("" or "ephemeralcontainers"). It returns the plugin's refusal, nil if admitted.
func (a admissionPlane) admit(p, old *corev1.Pod, subresource string) error {
	op, opts := admission.Create, runtime.Object(&metav1.CreateOptions{})
	var oldObj runtime.Object
	if old != nil {
		op, opts, oldObj = admission.Update, &metav1.UpdateOptions{}, old
	}
	attrs := admission.NewAttributesRecord(p, oldObj, corev1.SchemeGroupVersion.WithKind("Pod"), p.Namespace, p.Name,
		corev1.SchemeGroupVersion.WithResource("pods"), subresource, op, opts, false, nil)
	return a.ctx.Plugin.Dispatch(a.ctx, attrs, admission.NewObjectInterfacesFromScheme(clientgoscheme.Scheme))
}

// buildImage is the buildkit image the tests' build pool names: the parameter ConfigMap's
// first image, as an install sets both to the same; the README's example without one.
func buildImage(objs admissionObjects) string {
	return firstParam(objs, "images", "ghcr.io/example/gitea-dynamic-runner-buildkit:v1")
}

// dockerTestImage is the docker image an operator enabling docker names in the pools and the
// policy's parameters (deploy/README.md, "Docker workflows"); the shipped ConfigMap names none.
const dockerTestImage = "ghcr.io/example/gitea-dynamic-runner-docker:v1"

// enableDocker sets the parameter ConfigMap's dockerImages to dockerTestImage, as an operator
// enabling docker does, and returns objs.
func enableDocker(t testing.TB, objs admissionObjects) admissionObjects {
	t.Helper()
	if objs.params == nil {
		t.Fatalf("%s: no parameter ConfigMap", admissionFile)
	}
	if _, ok := objs.params.Data["dockerImages"]; !ok {
		t.Fatalf("%s: the ConfigMap has no dockerImages key for an operator to fill", admissionFile)
	}
	objs.params = objs.params.DeepCopy()
	objs.params.Data["dockerImages"] = dockerTestImage + "\n"
	return objs
}

// firstParam is the parameter ConfigMap's first value under key, or fallback.
func firstParam(objs admissionObjects, key, fallback string) string {
	if objs.params != nil {
		for _, line := range strings.Split(objs.params.Data[key], "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				return line
			}
		}
	}
	return fallback
}

// buildExecutorPod is the executor Pod the real pod backend creates for the shipped pool linux
// given the build capability with image (its other settings the defaults), and the docker
// capability with dockerImage unless it is "", in the executors' namespace.
func buildExecutorPod(t *testing.T, image, dockerImage string) *corev1.Pod {
	t.Helper()
	docs := buildKustomization(t, "keda")
	for i, d := range docs {
		if d.kind() != "ConfigMap" || d.name() != "gdr-pools" {
			continue
		}
		var pools map[string]any
		if err := yaml.Unmarshal([]byte(path(d.obj, "data", "pools.yaml").(string)), &pools); err != nil {
			t.Fatal(err)
		}
		linux := pools["pools"].([]any)[0].(map[string]any)
		linux["profile"].(map[string]any)["build"] = map[string]any{"image": image}
		if dockerImage != "" {
			linux["profile"].(map[string]any)["docker"] = map[string]any{"image": dockerImage}
		}
		text, err := yaml.Marshal(pools)
		if err != nil {
			t.Fatal(err)
		}
		obj := map[string]any{}
		for k, v := range d.obj {
			obj[k] = v
		}
		obj["data"] = map[string]any{"pools.yaml": string(text)}
		docs[i] = doc{file: d.file, obj: obj}
	}
	p := executorPod(t, docs)
	if containerNamed(p, pod.BuildContainer) == nil {
		t.Fatalf("executor Pod %s has no %s: the build capability did not apply", p.Name, pod.BuildContainer)
	}
	if dockerImage != "" && containerNamed(p, pod.DockerContainer) == nil {
		t.Fatalf("executor Pod %s has no %s: the docker capability did not apply", p.Name, pod.DockerContainer)
	}
	p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	return p
}

// containerNamed is p's init container or container name, nil if none.
func containerNamed(p *corev1.Pod, name string) *corev1.Container {
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// admissionCase is a change to the build executor Pod and the policy's answer to it.
type admissionCase struct {
	name string
	// subresource "ephemeralcontainers": an update of the stored Pod through it; "": a create.
	subresource string
	namespace   string // "": the executors'
	edit        func(p *corev1.Pod)
	want        string // "": admitted; else the refusal names it
}

// admissionCases are what TestExecutorsAdmissionPolicy asks the API server's policy plugin
// and TestE2EExecutorsAdmissionPolicy a real kube-apiserver.
func admissionCases() []admissionCase {
	sidecar := func(p *corev1.Pod) *corev1.Container { return containerNamed(p, pod.BuildContainer) }
	docker := func(p *corev1.Pod) *corev1.Container { return containerNamed(p, pod.DockerContainer) }
	runner := func(p *corev1.Pod) *corev1.Container { return containerNamed(p, pod.RunnerContainer) }
	tun := func(p *corev1.Pod) *corev1.Volume {
		for i, v := range p.Spec.Volumes {
			if v.HostPath != nil && v.HostPath.Path == pod.TunDevice {
				return &p.Spec.Volumes[i]
			}
		}
		panic("the docker Pod has no " + pod.TunDevice + " volume")
	}
	mountTun := func(c *corev1.Container, p *corev1.Pod, readOnly bool) {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: tun(p).Name, MountPath: "/dev/tun-too", ReadOnly: readOnly})
	}
	no, yes := false, true
	debug := func(edit func(sc *corev1.SecurityContext)) func(p *corev1.Pod) {
		return func(p *corev1.Pod) {
			sc := &corev1.SecurityContext{RunAsNonRoot: &yes, AllowPrivilegeEscalation: &no,
				Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
			if edit != nil {
				edit(sc)
			}
			p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{
				EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "busybox:1", SecurityContext: sc}})
		}
	}
	const (
		sidecarRule   = "a sidecar runs one of the images the ConfigMap gdr-executors-build names for it"
		sidecarCaps   = "the sidecars gdr-buildkit and gdr-docker are not privileged"
		restricted    = "every container of an executor Pod but the sidecars gdr-buildkit and gdr-docker is restricted"
		ephemeralRule = "an ephemeral container of an executor Pod is restricted"
		volumeRule    = "an executor Pod's volumes are of Pod Security restricted's kinds"
	)
	return []admissionCase{
		{name: "the build and docker Pod as the pod backend makes it"},
		{name: "the docker sidecar in the Pod's user namespace, its /proc unmasked (docker.userNamespace)",
			edit: func(p *corev1.Pod) {
				unmasked := corev1.UnmaskedProcMount
				p.Spec.HostUsers, docker(p).SecurityContext.ProcMount = ptr.To(false), &unmasked
			}},
		{name: "the docker sidecar from the buildkit image", want: sidecarRule,
			edit: func(p *corev1.Pod) { docker(p).Image = sidecar(p).Image }},
		{name: "the build sidecar from the docker image", want: sidecarRule,
			edit: func(p *corev1.Pod) { sidecar(p).Image = docker(p).Image }},
		{name: "the docker sidecar with a command of its own", want: sidecarRule,
			edit: func(p *corev1.Pod) { docker(p).Command = []string{"dockerd"} }},
		{name: "the docker sidecar as root", want: "every container of an executor Pod runs as non-root",
			edit: func(p *corev1.Pod) {
				docker(p).SecurityContext.RunAsUser, docker(p).SecurityContext.RunAsNonRoot = ptr.To(int64(0)), &no
			}},
		{name: "the docker sidecar adding NET_ADMIN", want: sidecarCaps, edit: func(p *corev1.Pod) {
			docker(p).SecurityContext.Capabilities.Add = append(docker(p).SecurityContext.Capabilities.Add, "NET_ADMIN")
		}},
		{name: "the docker sidecar privileged", want: sidecarCaps,
			edit: func(p *corev1.Pod) { docker(p).SecurityContext.Privileged = &yes }},
		{name: "the docker sidecar with a writable root", want: sidecarCaps,
			edit: func(p *corev1.Pod) { docker(p).SecurityContext.ReadOnlyRootFilesystem = &no }},
		{name: "the tun device mounted writable", want: volumeRule, edit: func(p *corev1.Pod) {
			for i, m := range docker(p).VolumeMounts {
				if m.Name == tun(p).Name {
					docker(p).VolumeMounts[i].ReadOnly = false
				}
			}
		}},
		{name: "the tun device mounted by the job's container too", want: volumeRule,
			edit: func(p *corev1.Pod) { mountTun(runner(p), p, true) }},
		{name: "the tun device mounted by the build sidecar too", want: volumeRule,
			edit: func(p *corev1.Pod) { mountTun(sidecar(p), p, true) }},
		{name: "the tun volume of another type", want: volumeRule,
			edit: func(p *corev1.Pod) { tun(p).HostPath.Type = ptr.To(corev1.HostPathUnset) }},
		{name: "the tun volume at another path", want: volumeRule,
			edit: func(p *corev1.Pod) { tun(p).HostPath.Path = "/dev/kmsg" }},
		{name: "the node's root as a volume of the docker sidecar", want: volumeRule, edit: func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
			docker(p).VolumeMounts = append(docker(p).VolumeMounts, corev1.VolumeMount{Name: "root", MountPath: "/host", ReadOnly: true})
		}},
		{name: "the sidecar from another image", want: sidecarRule,
			edit: func(p *corev1.Pod) { sidecar(p).Image = "registry.example.com/anything:latest" }},
		{name: "the sidecar from the image under another tag", want: sidecarRule,
			edit: func(p *corev1.Pod) { sidecar(p).Image = strings.SplitN(sidecar(p).Image, ":", 2)[0] + ":other" }},
		{name: "the sidecar as another non-root user", want: sidecarRule,
			edit: func(p *corev1.Pod) { sidecar(p).SecurityContext.RunAsUser = ptr.To(int64(1000)) }},
		{name: "the sidecar as the image's user, unnamed", want: sidecarRule,
			edit: func(p *corev1.Pod) { sidecar(p).SecurityContext.RunAsUser = nil }},
		{name: "the sidecar in another group", want: sidecarRule,
			edit: func(p *corev1.Pod) { sidecar(p).SecurityContext.RunAsGroup = ptr.To(int64(0)) }},
		{name: "the sidecar under another Localhost profile", want: sidecarRule,
			edit: func(p *corev1.Pod) {
				sidecar(p).SecurityContext.SeccompProfile.LocalhostProfile = ptr.To("gdr/unconfined.json")
			}},
		{name: "the sidecar with a command of its own", want: sidecarRule,
			edit: func(p *corev1.Pod) { sidecar(p).Command = []string{"/bin/sh", "-c", "id"} }},
		{name: "the sidecar with arguments of its own", want: sidecarRule,
			edit: func(p *corev1.Pod) { sidecar(p).Args = []string{"--oci-worker-no-process-sandbox"} }},
		{name: "the sidecar adding DAC_OVERRIDE", want: sidecarCaps, edit: func(p *corev1.Pod) {
			sidecar(p).SecurityContext.Capabilities.Add = append(sidecar(p).SecurityContext.Capabilities.Add, "DAC_OVERRIDE")
		}},
		{name: "the job's container adding SETUID", want: restricted, edit: func(p *corev1.Pod) {
			runner(p).SecurityContext.Capabilities.Add = []corev1.Capability{"SETUID"}
		}},
		{name: "the job's container as root", want: "every container of an executor Pod runs as non-root", edit: func(p *corev1.Pod) {
			runner(p).SecurityContext.RunAsNonRoot, runner(p).SecurityContext.RunAsUser = &no, ptr.To(int64(0))
		}},
		{name: "a restricted ephemeral container (kubectl debug)", subresource: "ephemeralcontainers", edit: debug(nil)},
		{name: "a privileged ephemeral container", subresource: "ephemeralcontainers", want: ephemeralRule,
			edit: debug(func(sc *corev1.SecurityContext) { sc.Privileged, sc.AllowPrivilegeEscalation = &yes, &yes })},
		{name: "an ephemeral container adding SYS_PTRACE", subresource: "ephemeralcontainers", want: ephemeralRule,
			edit: debug(func(sc *corev1.SecurityContext) { sc.Capabilities.Add = []corev1.Capability{"SYS_PTRACE"} })},
		{name: "an ephemeral container as root", subresource: "ephemeralcontainers", want: ephemeralRule,
			edit: debug(func(sc *corev1.SecurityContext) { sc.RunAsNonRoot, sc.RunAsUser = &no, ptr.To(int64(0)) })},
		{name: "an ephemeral container without seccomp", subresource: "ephemeralcontainers", want: ephemeralRule,
			edit: debug(func(sc *corev1.SecurityContext) {
				sc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
			})},
		{name: "the sidecar from another image in another namespace", namespace: "elsewhere",
			edit: func(p *corev1.Pod) { sidecar(p).Image = "registry.example.com/anything:latest" }},
	}
}

// checkAdmission asks admit (create p, or update old to p through subresource) about each
// case's change to built, and checks the answer.
func checkAdmission(t *testing.T, built *corev1.Pod, admit func(p, old *corev1.Pod, subresource string) error) {
	for _, tc := range admissionCases() {
		t.Run(tc.name, func(t *testing.T) {
			p := built.DeepCopy()
			if tc.namespace != "" {
				p.Namespace = tc.namespace
			}
			var old *corev1.Pod
			if tc.subresource != "" {
				old = p.DeepCopy()
			}
			if tc.edit != nil {
				tc.edit(p)
			}
			err := admit(p, old, tc.subresource)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("admitted, want refused with %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("refused with %v, want %q", err, tc.want)
			case err != nil:
				t.Logf("refused: %v", err)
			}
		})
	}
}

// TestExecutorsAdmissionPolicy evaluates deploy/admission's policy in the API server's own
// ValidatingAdmissionPolicy plugin (k8s.io/apiserver: CEL compiled and run as the server does,
// its matcher, binding and parameter resolution) on the executor Pod the real pod backend
// makes for a pool with both the build and the docker capability (docker enabled in the
// parameters as deploy/README.md says), and on that Pod changed: each sidecar's exception holds
// for its installed image, user 65532 and Localhost profile alone, with the image's own
// entrypoint; the node's /dev/net/tun for gdr-docker alone, read-only; every other container
// stays restricted; an ephemeral container added through the pods/ephemeralcontainers
// subresource (what kubectl debug does) is held to restricted too; outside the executors'
// namespace the policy does not apply.
func TestExecutorsAdmissionPolicy(t *testing.T) {
	objs := enableDocker(t, loadAdmission(t))
	plane := startAdmission(t, objs)
	built := buildExecutorPod(t, buildImage(objs), dockerTestImage)
	if built.Namespace != jobsNamespace {
		t.Fatalf("executor Pod in %q, want %q", built.Namespace, jobsNamespace)
	}
	checkAdmission(t, built, plane.admit)
}

// TestExecutorsAdmissionPolicyDockerOff: as shipped, the parameters name no docker image, so a
// Pod with the docker sidecar is refused while a build Pod is admitted; docker is on only where
// an operator names its image.
func TestExecutorsAdmissionPolicyDockerOff(t *testing.T) {
	objs := loadAdmission(t)
	plane := startAdmission(t, objs)
	if err := plane.admit(buildExecutorPod(t, buildImage(objs), ""), nil, ""); err != nil {
		t.Fatalf("the build Pod refused: %v", err)
	}
	err := plane.admit(buildExecutorPod(t, buildImage(objs), dockerTestImage), nil, "")
	if err == nil || !strings.Contains(err.Error(), "dockerImages for gdr-docker") {
		t.Fatalf("the docker Pod under the shipped parameters: %v, want refused naming dockerImages", err)
	}
}

// TestExecutorsAdmissionPolicyWithoutParameters: the policy pins the sidecar to what the
// install names in its parameter ConfigMap; without that ConfigMap no executor Pod is
// admitted (the binding denies rather than skipping its checks).
func TestExecutorsAdmissionPolicyWithoutParameters(t *testing.T) {
	objs := loadAdmission(t)
	if objs.binding.Spec.ParamRef == nil || objs.params == nil {
		t.Fatalf("%s: the binding takes no parameters (paramRef %v, ConfigMap %v): nothing the install sets pins the sidecar", admissionFile, objs.binding.Spec.ParamRef, objs.params != nil)
	}
	built := buildExecutorPod(t, buildImage(objs), "")
	if err := startAdmission(t, objs).admit(built.DeepCopy(), nil, ""); err != nil {
		t.Fatalf("with the parameters: %v", err)
	}
	objs.params = nil
	err := startAdmission(t, objs).admit(built.DeepCopy(), nil, "")
	if err == nil {
		t.Fatal("admitted without the parameter ConfigMap")
	}
	t.Logf("refused: %v", err)
}

// baselineCase is a change to the build and docker executor Pod that Pod Security baseline's
// check id refuses (admit: a change that check admits).
type baselineCase struct {
	id    psapolicy.CheckID
	name  string
	admit bool
	edit  func(p *corev1.Pod)
}

// baselineCases are one or more changes for each of baseline's checks.
func baselineCases() []baselineCase {
	runner := func(p *corev1.Pod) *corev1.Container { return containerNamed(p, pod.RunnerContainer) }
	docker := func(p *corev1.Pod) *corev1.Container { return containerNamed(p, pod.DockerContainer) }
	podSC := func(p *corev1.Pod) *corev1.PodSecurityContext {
		if p.Spec.SecurityContext == nil {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{}
		}
		return p.Spec.SecurityContext
	}
	yes := true
	unmasked := corev1.UnmaskedProcMount
	hostPath := func(c func(p *corev1.Pod) *corev1.Container, path string) func(p *corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}})
			c(p).VolumeMounts = append(c(p).VolumeMounts, corev1.VolumeMount{Name: "host", MountPath: "/host", ReadOnly: true})
		}
	}
	return []baselineCase{
		{id: "hostNamespaces", name: "hostNetwork", edit: func(p *corev1.Pod) { p.Spec.HostNetwork = true }},
		{id: "hostNamespaces", name: "hostPID", edit: func(p *corev1.Pod) { p.Spec.HostPID = true }},
		{id: "hostNamespaces", name: "hostIPC", edit: func(p *corev1.Pod) { p.Spec.HostIPC = true }},
		{id: "hostPorts", name: "a hostPort on the job's container", edit: func(p *corev1.Pod) {
			runner(p).Ports = append(runner(p).Ports, corev1.ContainerPort{ContainerPort: 8080, HostPort: 8080})
		}},
		{id: "privileged", name: "the docker sidecar privileged", edit: func(p *corev1.Pod) { docker(p).SecurityContext.Privileged = &yes }},
		{id: "capabilities_baseline", name: "the job's container adding SYS_ADMIN", edit: func(p *corev1.Pod) {
			runner(p).SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
		}},
		{id: "capabilities_baseline", name: "the docker sidecar adding NET_ADMIN", edit: func(p *corev1.Pod) {
			docker(p).SecurityContext.Capabilities.Add = append(docker(p).SecurityContext.Capabilities.Add, "NET_ADMIN")
		}},
		{id: "hostPathVolumes", name: "the node's root in the job's container", edit: hostPath(runner, "/")},
		{id: "hostPathVolumes", name: "the node's Docker socket in the docker sidecar", edit: hostPath(docker, "/var/run/docker.sock")},
		{id: "appArmorProfile", name: "the Pod AppArmor-unconfined", edit: func(p *corev1.Pod) {
			podSC(p).AppArmorProfile = &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
		}},
		{id: "appArmorProfile", name: "the docker sidecar AppArmor-unconfined", edit: func(p *corev1.Pod) {
			docker(p).SecurityContext.AppArmorProfile = &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
		}},
		{id: "appArmorProfile", name: "the beta annotation unconfined", edit: func(p *corev1.Pod) {
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[corev1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix+pod.DockerContainer] = "unconfined"
		}},
		{id: "seLinuxOptions", name: "the Pod as spc_t", edit: func(p *corev1.Pod) { podSC(p).SELinuxOptions = &corev1.SELinuxOptions{Type: "spc_t"} }},
		{id: "seLinuxOptions", name: "the job's container with an SELinux user", edit: func(p *corev1.Pod) {
			runner(p).SecurityContext.SELinuxOptions = &corev1.SELinuxOptions{User: "system_u"}
		}},
		{id: "seLinuxOptions", name: "the docker sidecar with an SELinux role", edit: func(p *corev1.Pod) {
			docker(p).SecurityContext.SELinuxOptions = &corev1.SELinuxOptions{Role: "system_r"}
		}},
		{id: "procMount", name: "the docker sidecar's /proc unmasked, no user namespace", edit: func(p *corev1.Pod) {
			docker(p).SecurityContext.ProcMount = &unmasked
		}},
		{id: "procMount", name: "the docker sidecar's /proc unmasked in a user namespace", admit: true, edit: func(p *corev1.Pod) {
			docker(p).SecurityContext.ProcMount, p.Spec.HostUsers = &unmasked, ptr.To(false)
		}},
		{id: "seccompProfile_baseline", name: "the docker sidecar unconfined", edit: func(p *corev1.Pod) {
			docker(p).SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}},
		{id: "sysctls", name: "an unsafe sysctl", edit: func(p *corev1.Pod) {
			podSC(p).Sysctls = []corev1.Sysctl{{Name: "kernel.msgmax", Value: "65536"}}
		}},
		{id: "sysctls", name: "a safe sysctl", admit: true, edit: func(p *corev1.Pod) {
			podSC(p).Sysctls = []corev1.Sysctl{{Name: "net.ipv4.tcp_keepalive_time", Value: "60"}}
		}},
		{id: "windowsHostProcess", name: "a Windows host process", edit: func(p *corev1.Pod) {
			runner(p).SecurityContext.WindowsOptions = &corev1.WindowsSecurityContextOptions{HostProcess: &yes}
		}},
		{id: "hostProbesAndHostLifecycle", name: "a probe aimed at another host", edit: func(p *corev1.Pod) {
			runner(p).ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Host: "10.0.0.1", Port: intstr.FromInt(80)}}}
		}},
		{id: "hostProbesAndHostLifecycle", name: "a hook aimed at another host", edit: func(p *corev1.Pod) {
			docker(p).Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{TCPSocket: &corev1.TCPSocketAction{Host: "10.0.0.1", Port: intstr.FromInt(80)}}}
		}},
	}
}

// TestExecutorsAdmissionPolicyBaseline: where a namespace enforces Pod Security privileged (what
// the docker capability's /dev/net/tun needs), the policy refuses what baseline refuses, with
// that one exception. Pod Security's own library (k8s.io/pod-security-admission, the checks the
// API server runs) is the oracle: the build Pod passes every baseline check; the build and
// docker Pod fails hostPathVolumes alone (the exception) and the policy admits it; each case's
// change fails the check it names (so the case proves what it claims) and the policy refuses
// it, or passes and the policy admits it; every baseline check of this Kubernetes release has a
// case, so a check a later release adds fails this test until the policy has it.
func TestExecutorsAdmissionPolicyBaseline(t *testing.T) {
	checks := map[psapolicy.CheckID]psapolicy.CheckPodFn{}
	for _, c := range psapolicy.DefaultChecks() {
		if c.Level == psaapi.LevelBaseline {
			checks[c.ID] = c.Versions[len(c.Versions)-1].CheckPod
		}
	}
	failing := func(p *corev1.Pod) []string {
		var ids []string
		for id, check := range checks {
			if r := check(&p.ObjectMeta, &p.Spec); !r.Allowed {
				ids = append(ids, string(id)+": "+r.ForbiddenReason+" ("+r.ForbiddenDetail+")")
			}
		}
		slices.Sort(ids)
		return ids
	}
	objs := enableDocker(t, loadAdmission(t))
	plane := startAdmission(t, objs)
	if got := failing(buildExecutorPod(t, buildImage(objs), "")); len(got) != 0 {
		t.Fatalf("the build Pod fails baseline: %v", got)
	}
	built := buildExecutorPod(t, buildImage(objs), dockerTestImage)
	if got := failing(built); len(got) != 1 || !strings.HasPrefix(got[0], "hostPathVolumes: ") || !strings.Contains(got[0], `"gdr-docker-tun"`) {
		t.Fatalf("the build and docker Pod fails baseline in %v, want in hostPathVolumes (gdr-docker-tun, %s) alone", got, pod.TunDevice)
	}
	if err := plane.admit(built.DeepCopy(), nil, ""); err != nil {
		t.Fatalf("the build and docker Pod refused: %v", err)
	}
	covered := map[psapolicy.CheckID]bool{}
	for _, tc := range baselineCases() {
		t.Run(string(tc.id)+"/"+tc.name, func(t *testing.T) {
			check, ok := checks[tc.id]
			if !ok {
				t.Fatalf("baseline has no check %s", tc.id)
			}
			p := built.DeepCopy()
			tc.edit(p)
			if r := check(&p.ObjectMeta, &p.Spec); r.Allowed != tc.admit {
				t.Fatalf("baseline's %s allows the change: %v, want %v", tc.id, r.Allowed, tc.admit)
			}
			err := plane.admit(p, nil, "")
			switch {
			case tc.admit && err != nil:
				t.Fatalf("refused what baseline admits: %v", err)
			case !tc.admit && err == nil:
				t.Fatal("admitted what baseline refuses")
			case err != nil:
				t.Logf("refused: %v", err)
			}
		})
		if !tc.admit {
			covered[tc.id] = true
		}
	}
	for id := range checks {
		if !covered[id] {
			t.Errorf("baseline's check %s has no case the policy must refuse", id)
		}
	}
}
