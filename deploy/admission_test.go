package deploy

import (
	"os"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/generic"
	"k8s.io/apiserver/pkg/admission/plugin/policy/matching"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
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
	if objs.params != nil {
		for _, line := range strings.Split(objs.params.Data["images"], "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				return line
			}
		}
	}
	return "ghcr.io/example/gitea-dynamic-runner-buildkit:v1"
}

// buildExecutorPod is the executor Pod the real pod backend creates for the shipped pool linux
// given the build capability with image (its other settings the defaults), in the executors'
// namespace.
func buildExecutorPod(t *testing.T, image string) *corev1.Pod {
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
	runner := func(p *corev1.Pod) *corev1.Container { return containerNamed(p, pod.RunnerContainer) }
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
		sidecarRule   = "the build sidecar gdr-buildkit"
		restricted    = "every container of an executor Pod but the build sidecar gdr-buildkit is restricted"
		ephemeralRule = "an ephemeral container of an executor Pod is restricted"
	)
	return []admissionCase{
		{name: "the build Pod as the pod backend makes it"},
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
		{name: "the sidecar adding DAC_OVERRIDE", want: sidecarRule, edit: func(p *corev1.Pod) {
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
// makes for a build pool, and on that Pod changed: the build sidecar's exception holds for the
// installed buildkit image, its user 65532 and its Localhost profile alone, with the image's own
// entrypoint; every container but the sidecar stays restricted; an ephemeral container added
// through the pods/ephemeralcontainers subresource (what kubectl debug does) is held to
// restricted too; outside the executors' namespace the policy does not apply.
func TestExecutorsAdmissionPolicy(t *testing.T) {
	objs := loadAdmission(t)
	plane := startAdmission(t, objs)
	built := buildExecutorPod(t, buildImage(objs))
	if built.Namespace != jobsNamespace {
		t.Fatalf("executor Pod in %q, want %q", built.Namespace, jobsNamespace)
	}
	checkAdmission(t, built, plane.admit)
}

// TestExecutorsAdmissionPolicyWithoutParameters: the policy pins the sidecar to what the
// install names in its parameter ConfigMap; without that ConfigMap no executor Pod is
// admitted (the binding denies rather than skipping its checks).
func TestExecutorsAdmissionPolicyWithoutParameters(t *testing.T) {
	objs := loadAdmission(t)
	if objs.binding.Spec.ParamRef == nil || objs.params == nil {
		t.Fatalf("%s: the binding takes no parameters (paramRef %v, ConfigMap %v): nothing the install sets pins the sidecar", admissionFile, objs.binding.Spec.ParamRef, objs.params != nil)
	}
	built := buildExecutorPod(t, buildImage(objs))
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
