package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/channelenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

// manifestDirs are the folders whose every YAML document is checked: base holds what both
// install paths (the kustomizations keda and knative) include.
var manifestDirs = []string{"base", "keda", "knative"}

// doc is one YAML document of a manifest file.
type doc struct {
	file string
	raw  []byte
	obj  map[string]any
}

func (d doc) apiVersion() string { s, _ := d.obj["apiVersion"].(string); return s }
func (d doc) kind() string       { s, _ := d.obj["kind"].(string); return s }
func (d doc) name() string {
	m, _ := d.obj["metadata"].(map[string]any)
	if n, ok := m["name"].(string); ok {
		return n
	}
	n, _ := m["generateName"].(string)
	return n
}
func (d doc) String() string { return fmt.Sprintf("%s: %s %s", d.file, d.kind(), d.name()) }

// splitDocs returns the non-empty YAML documents of data.
func splitDocs(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out [][]byte
	for {
		b, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var probe map[string]any
		if err := yaml.Unmarshal(b, &probe); err != nil {
			return nil, err
		}
		if len(probe) == 0 {
			continue
		}
		out = append(out, b)
	}
}

// loadManifests reads every *.yaml under the manifest folders, recursively.
func loadManifests(t *testing.T) []doc {
	t.Helper()
	var docs []doc
	for _, dir := range manifestDirs {
		err := filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
				return err
			}
			if e.Name() == "kustomization.yaml" {
				return nil // kustomize's own file, checked by kustomize_test.go
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			parts, err := splitDocs(data)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			for _, p := range parts {
				var obj map[string]any
				if err := yaml.Unmarshal(p, &obj); err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
				docs = append(docs, doc{file: path, raw: p, obj: obj})
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(docs) == 0 {
		t.Fatal("no manifests found")
	}
	return docs
}

// crdSchema validates custom resources of one group/version/kind the way the API server does:
// the CRD's structural schema as an OpenAPI schema (what
// k8s.io/apiextensions-apiserver/pkg/apiserver/validation.NewSchemaValidator builds; that package
// itself pulls k8s.io/apiserver and its feature gates into the module) and pruning for unknown
// fields. CEL rules (x-kubernetes-validations) are not evaluated.
type crdSchema struct {
	validator  *validate.SchemaValidator
	structural *structuralschema.Structural
}

// validate returns the schema errors of obj, and its fields the schema does not know (what an
// API server with strict field validation rejects).
func (s crdSchema) validate(obj map[string]any) []string {
	var errs []string
	res := s.validator.Validate(obj)
	for _, e := range res.Errors {
		errs = append(errs, e.Error())
	}
	cp := runtime.DeepCopyJSON(obj)
	for _, p := range pruning.PruneWithOptions(cp, s.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}) {
		errs = append(errs, "unknown field "+p)
	}
	sort.Strings(errs)
	return errs
}

// loadCRDs reads testdata/crds and indexes their served versions by "group/version/Kind".
func loadCRDs(t *testing.T) map[string]crdSchema {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRD files: %v", err)
	}
	out := map[string]crdSchema{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		parts, err := splitDocs(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range parts {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := yaml.Unmarshal(p, &crd); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if crd.Kind != "CustomResourceDefinition" {
				continue
			}
			for _, v := range crd.Spec.Versions {
				if !v.Served || v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
					continue
				}
				var internal apiextensions.JSONSchemaProps
				if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
					t.Fatalf("%s %s: convert: %v", f, v.Name, err)
				}
				structural, err := structuralschema.NewStructural(&internal)
				if err != nil {
					t.Fatalf("%s %s: structural: %v", f, v.Name, err)
				}
				validator := validate.NewSchemaValidator(structural.ToKubeOpenAPI(), nil, "", strfmt.Default)
				out[crd.Spec.Group+"/"+v.Name+"/"+crd.Spec.Names.Kind] = crdSchema{validator: validator, structural: structural}
			}
		}
	}
	return out
}

func crdKey(apiVersion, kind string) string { return apiVersion + "/" + kind }

// builtins are the built-in kinds the manifests may use, decoded strictly.
var builtins = map[string]func() any{
	"v1/ConfigMap":                                    func() any { return &corev1.ConfigMap{} },
	"v1/Service":                                      func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                               func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                              func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                                    func() any { return &batchv1.Job{} },
	"batch/v1/CronJob":                                func() any { return &batchv1.CronJob{} },
	"rbac.authorization.k8s.io/v1/Role":               func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":        func() any { return &rbacv1.RoleBinding{} },
	"rbac.authorization.k8s.io/v1/ClusterRole":        func() any { return &rbacv1.ClusterRole{} },
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": func() any { return &rbacv1.ClusterRoleBinding{} },
	"networking.k8s.io/v1/NetworkPolicy":              func() any { return &networkingv1.NetworkPolicy{} },
	"policy/v1/PodDisruptionBudget":                   func() any { return &policyv1.PodDisruptionBudget{} },
}

// strict decodes data into v, failing on unknown and duplicate fields.
func strict(data []byte, v any) error { return yaml.UnmarshalStrict(data, v) }

// strictValue re-encodes part of a document and decodes it strictly into v.
func strictValue(part any, v any) error {
	b, err := yaml.Marshal(part)
	if err != nil {
		return err
	}
	return strict(b, v)
}

func TestManifestsValidate(t *testing.T) {
	crds := loadCRDs(t)
	for _, d := range loadManifests(t) {
		t.Run(d.String(), func(t *testing.T) {
			key := crdKey(d.apiVersion(), d.kind())
			if md, _ := d.obj["metadata"].(map[string]any); md["namespace"] != nil {
				t.Errorf("metadata.namespace is set: the manifests are namespace-agnostic")
			}
			if d.kind() == "Secret" {
				t.Fatalf("a Secret in the manifests: create gdr-secrets with kubectl (deploy/README.md)")
			}
			if newObj, ok := builtins[key]; ok {
				if err := strict(d.raw, newObj()); err != nil {
					t.Fatalf("strict decode: %v", err)
				}
				return
			}
			s, ok := crds[key]
			if !ok {
				t.Fatalf("no CRD and no built-in type for %s", key)
			}
			if errs := s.validate(d.obj); len(errs) > 0 {
				t.Fatalf("invalid against the CRD schema:\n%s", strings.Join(errs, "\n"))
			}
			checkCustomBody(t, d)
		})
	}
}

// checkCustomBody decodes the built-in parts embedded in custom resources strictly, and checks
// the keys the CRD schemas leave open (Knative delivery and template annotations).
func checkCustomBody(t *testing.T, d doc) {
	t.Helper()
	spec, _ := d.obj["spec"].(map[string]any)
	switch d.kind() {
	case "ScaledJob":
		var js batchv1.JobSpec
		if err := strictValue(spec["jobTargetRef"], &js); err != nil {
			t.Errorf("jobTargetRef: %v", err)
		}
	case "Service": // serving.knative.dev
		tmpl, _ := spec["template"].(map[string]any)
		var meta struct {
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		}
		if err := strictValue(tmpl["metadata"], &meta); err != nil {
			t.Errorf("template.metadata: %v", err)
		}
		for k := range meta.Annotations {
			if !knownKnativeAnnotations[k] {
				t.Errorf("template annotation %q is not a known Knative autoscaling annotation", k)
			}
		}
		ps, _ := runtime.DeepCopyJSONValue(tmpl["spec"]).(map[string]any)
		delete(ps, "containerConcurrency")
		delete(ps, "timeoutSeconds")
		var pod corev1.PodSpec
		if err := strictValue(ps, &pod); err != nil {
			t.Errorf("template.spec: %v", err)
		}
	case "Subscription", "NatsJetStreamChannel":
		if del, ok := spec["delivery"].(map[string]any); ok {
			for k := range del {
				if !knownDeliveryFields[k] {
					t.Errorf("delivery.%s is not a delivery field", k)
				}
			}
		}
	}
}

var knownKnativeAnnotations = map[string]bool{
	"autoscaling.knative.dev/min-scale":     true,
	"autoscaling.knative.dev/max-scale":     true,
	"autoscaling.knative.dev/initial-scale": true,
	"autoscaling.knative.dev/target":        true,
}

var knownDeliveryFields = map[string]bool{
	"retry": true, "backoffPolicy": true, "backoffDelay": true, "timeout": true, "deadLetterSink": true,
	"retryAfterMax": true, "format": true,
}

// installed returns the documents one install path applies: its folder (keda or knative) and
// base, which its kustomization includes.
func installed(docs []doc, dir string) []doc {
	return append(under(docs, "base"), under(docs, dir)...)
}

// under returns the documents of one manifest folder.
func under(docs []doc, dir string) []doc {
	var out []doc
	for _, d := range docs {
		if strings.HasPrefix(filepath.ToSlash(d.file), dir+"/") {
			out = append(out, d)
		}
	}
	return out
}

// find returns the documents of a kind and name ("" for any name).
func find(docs []doc, kind, name string) []doc {
	var out []doc
	for _, d := range docs {
		if d.kind() == kind && (name == "" || d.name() == name) {
			out = append(out, d)
		}
	}
	return out
}

func one(t *testing.T, docs []doc, kind, name string) doc {
	t.Helper()
	found := find(docs, kind, name)
	if len(found) != 1 {
		t.Fatalf("want one %s %s, found %d", kind, name, len(found))
	}
	return found[0]
}

// envOf returns the literal env values of the first container of a pod spec.
func envOf(t *testing.T, podSpec any) map[string]string {
	t.Helper()
	var ps corev1.PodSpec
	b, _ := yaml.Marshal(podSpec)
	if err := yaml.Unmarshal(b, &ps); err != nil || len(ps.Containers) == 0 {
		t.Fatalf("pod spec: %v", err)
	}
	env := map[string]string{}
	for _, e := range ps.Containers[0].Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	return env
}

func path(obj any, keys ...string) any {
	for _, k := range keys {
		m, ok := obj.(map[string]any)
		if !ok {
			return nil
		}
		obj = m[k]
	}
	return obj
}

func TestScaledJobContract(t *testing.T) {
	docs := installed(loadManifests(t), "keda")
	sj := one(t, docs, "ScaledJob", "handle-pod")
	spec := sj.obj["spec"].(map[string]any)

	if pi, _ := spec["pollingInterval"].(float64); pi < 1 || pi > 5 {
		t.Errorf("pollingInterval %v: want 1-5 s", spec["pollingInterval"])
	}
	if s, ok := spec["scalingStrategy"]; ok {
		if st := path(s, "strategy"); st != nil && st != "default" {
			t.Errorf("scalingStrategy %v: want the default strategy", st)
		}
	}
	env := envOf(t, path(spec, "jobTargetRef", "template", "spec"))
	if env["GDR_MODE"] != "job" {
		t.Errorf("GDR_MODE %q: want job", env["GDR_MODE"])
	}
	backend := env["GDR_BACKEND"]
	if backend != "pod" {
		t.Errorf("GDR_BACKEND %q: want pod", backend)
	}
	// A run holds a waiting assignment for up to GDR_HOLD_FOR after its last fetch, which a
	// lingering run (GDR_LINGER) begins up to GDR_LINGER_MAX after its start: a deadline that
	// ends it sooner hands the assignment back through SIGTERM, and KEDA starts a Job again.
	durations := map[string]time.Duration{}
	for _, name := range []string{"GDR_FETCH_WAIT", "GDR_HOLD_FOR", "GDR_LINGER", "GDR_LINGER_MAX"} {
		d, err := time.ParseDuration(env[name])
		if err != nil {
			t.Errorf("%s %q: want a duration", name, env[name])
		}
		durations[name] = d
	}
	fetching := durations["GDR_FETCH_WAIT"]
	if durations["GDR_LINGER"] > 0 {
		fetching = max(fetching, durations["GDR_LINGER_MAX"])
	}
	deadline, _ := path(spec, "jobTargetRef", "activeDeadlineSeconds").(float64)
	if time.Duration(deadline)*time.Second <= fetching+durations["GDR_HOLD_FOR"] {
		t.Errorf("activeDeadlineSeconds %v: want more than the fetching %v (GDR_FETCH_WAIT, or GDR_LINGER_MAX when lingering) + GDR_HOLD_FOR %v",
			deadline, fetching, durations["GDR_HOLD_FOR"])
	}

	triggers, _ := spec["triggers"].([]any)
	if len(triggers) != 1 {
		t.Fatalf("want one trigger, have %d", len(triggers))
	}
	tr := triggers[0].(map[string]any)
	if tr["type"] != "nats-jetstream" {
		t.Errorf("trigger type %v: want nats-jetstream", tr["type"])
	}
	// sigs.k8s.io/yaml keeps an unquoted number or boolean as one, so it shows up here.
	md, _ := tr["metadata"].(map[string]any)
	for k, v := range md {
		if _, ok := v.(string); !ok {
			t.Errorf("trigger metadata %s = %v (%T): KEDA wants quoted strings", k, v, v)
		}
	}
	want := map[string]string{
		"account":                "$G",
		"stream":                 "CI_RUNNER",
		"consumer":               backend,
		"lagThreshold":           "1",
		"activationLagThreshold": "0",
	}
	for k, v := range want {
		if md[k] != v {
			t.Errorf("trigger metadata %s = %v, want %q", k, md[k], v)
		}
	}
	if ep, _ := md["natsServerMonitoringEndpoint"].(string); ep == "" {
		t.Error("trigger metadata natsServerMonitoringEndpoint is missing")
	}

	// handle-setup creates the very consumer the trigger watches, and alone sets its capacity:
	// job mode binds the consumer as it is and reads no GDR_MAX_IN_FLIGHT, so a value on handle-pod
	// would look like a setting and change nothing.
	setup := one(t, docs, "Job", "handle-setup")
	senv := envOf(t, path(setup.obj, "spec", "template", "spec"))
	if senv["GDR_MODE"] != "setup" || senv["GDR_BACKEND"] != backend {
		t.Errorf("handle-setup: GDR_MODE %q GDR_BACKEND %q, want setup and %q", senv["GDR_MODE"], senv["GDR_BACKEND"], backend)
	}
	if senv["GDR_MAX_IN_FLIGHT"] == "" {
		t.Error("handle-setup sets no GDR_MAX_IN_FLIGHT (the consumer's MaxAckPending)")
	}
	if v, ok := env["GDR_MAX_IN_FLIGHT"]; ok {
		t.Errorf("handle-pod sets GDR_MAX_IN_FLIGHT %q, which job mode ignores; set it on handle-setup", v)
	}
	if senv["GDR_STREAM"] != "" && senv["GDR_STREAM"] != "CI_RUNNER" {
		t.Errorf("handle-setup GDR_STREAM %q", senv["GDR_STREAM"])
	}
}

// TestKedaSchedules: on the KEDA path nothing of ours runs between jobs. dispatch serve and the
// gateway are Deployments without replicas, which their ScaledObjects take from zero and to
// zero (dispatch on Gitea's queued jobs and the assignments waiting, the gateway on the payload
// bucket's consumer); the one schedule left is recover's safety-net pass, every 5 minutes.
func TestKedaSchedules(t *testing.T) {
	docs := installed(loadManifests(t), "keda")
	var cronJobs []string
	for _, d := range docs {
		if d.kind() == "CronJob" {
			cronJobs = append(cronJobs, d.name())
		}
	}
	if !reflect.DeepEqual(cronJobs, []string{"recover"}) {
		t.Errorf("CronJobs %v: want recover's alone (nothing else of ours runs between jobs)", cronJobs)
	}
	var cj batchv1.CronJob
	if err := strict(one(t, docs, "CronJob", "recover").raw, &cj); err != nil {
		t.Fatal(err)
	}
	if cj.Spec.Schedule != "*/5 * * * *" {
		t.Errorf("recover schedule %q: want every 5 minutes", cj.Spec.Schedule)
	}
	if cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Error("recover: want concurrencyPolicy Forbid")
	}
	var dep appsv1.Deployment
	if err := strict(one(t, docs, "Deployment", "dispatch").raw, &dep); err != nil {
		t.Fatal(err)
	}
	if got := dep.Spec.Template.Spec.Containers[0].Args; !reflect.DeepEqual(got, []string{"serve"}) {
		t.Errorf("dispatch Deployment args %v: want [serve]", got)
	}
	for _, name := range []string{"dispatch", "gateway"} {
		if r := path(one(t, docs, "Deployment", name).obj, "spec", "replicas"); r != nil {
			t.Errorf("Deployment %s sets replicas %v: its ScaledObject's to set (an apply would undo them)", name, r)
		}
	}
	type trigger struct {
		Type              string            `json:"type"`
		Metadata          map[string]string `json:"metadata"`
		AuthenticationRef *struct {
			Name string `json:"name"`
		} `json:"authenticationRef"`
	}
	type scaledObject struct {
		Target   struct{ Name string } `json:"scaleTargetRef"`
		Min      *int                  `json:"minReplicaCount"`
		Max      int                   `json:"maxReplicaCount"`
		Triggers []trigger             `json:"triggers"`
		// InitialCooldown is initialCooldownPeriod (s).
		InitialCooldown int `json:"initialCooldownPeriod"`
	}
	scaled := map[string]scaledObject{}
	for _, name := range []string{"dispatch", "gateway"} {
		var v scaledObject
		b, err := yaml.Marshal(path(one(t, docs, "ScaledObject", name).obj, "spec"))
		if err == nil {
			err = yaml.Unmarshal(b, &v) // the fields read here; TestManifestsValidate checks the rest
		}
		if err != nil {
			t.Fatalf("ScaledObject %s: %v", name, err)
		}
		scaled[name] = v
		if v.Target.Name != name || v.Min == nil || *v.Min != 0 {
			t.Errorf("ScaledObject %s scales %q from %v: want Deployment %s from zero", name, v.Target.Name, v.Min, name)
		}
	}
	if d := scaled["dispatch"]; d.InitialCooldown < 30 {
		// dispatch's first run makes what the gateway's trigger reads (KV_CI_TASKS, consumer
		// gateway): scaled to zero before it starts, the gateway's ScaledObject stays in error.
		t.Errorf("ScaledObject dispatch: initialCooldownPeriod %d s: want its first run kept up (30 s at least) to make the bucket", d.InitialCooldown)
	}
	if d := scaled["dispatch"]; d.Max != 1 || len(d.Triggers) != 2 {
		t.Errorf("ScaledObject dispatch: max %d, %d triggers: want one replica at most, on the queue's lag and Gitea's queued jobs", d.Max, len(d.Triggers))
	} else {
		if q := d.Triggers[0]; q.Type != "nats-jetstream" || q.Metadata["stream"] != "CI_RUNNER" || q.Metadata["consumer"] != "pod" {
			t.Errorf("dispatch's first trigger %+v: want the assignments' consumer pod on CI_RUNNER", q)
		}
		g := d.Triggers[1]
		if g.Type != "metrics-api" || g.AuthenticationRef == nil || g.AuthenticationRef.Name != "gdr-gitea-read" || g.Metadata["authMode"] != "bearer" {
			t.Errorf("dispatch's Gitea trigger %+v: want metrics-api with the bearer token of gdr-gitea-read", g)
		}
		if !strings.Contains(g.Metadata["url"], "/api/v1/admin/actions/jobs?status=queued") || g.Metadata["valueLocation"] != `jobs.#(labels.#(=="ubuntu-latest"))#|#` {
			t.Errorf("dispatch's Gitea trigger reads %q at %q: want the queued jobs naming the pool linux's label", g.Metadata["url"], g.Metadata["valueLocation"])
		}
	}
	if g := scaled["gateway"]; len(g.Triggers) != 1 || g.Triggers[0].Type != "nats-jetstream" ||
		g.Triggers[0].Metadata["stream"] != "KV_CI_TASKS" || g.Triggers[0].Metadata["consumer"] != "gateway" {
		t.Errorf("ScaledObject gateway triggers %+v: want the payload bucket's consumer gateway", g.Triggers)
	}
	auth := one(t, docs, "TriggerAuthentication", "gdr-gitea-read")
	if ref, _ := path(auth.obj, "spec", "secretTargetRef").([]any); len(ref) != 1 ||
		!reflect.DeepEqual(ref[0], map[string]any{"parameter": "bearerToken", "name": "gdr-gitea-read", "key": "token"}) {
		t.Errorf("TriggerAuthentication gdr-gitea-read: %v", ref)
	}
	one(t, docs, "Deployment", "gateway")
	one(t, docs, "Service", "gateway")
	rn := one(t, docs, "Job", "recover-now-")
	if env := envOf(t, path(rn.obj, "spec", "template", "spec")); env["GDR_RECOVER_MODE"] != "once" {
		t.Errorf("recover-now GDR_RECOVER_MODE %q: want once", env["GDR_RECOVER_MODE"])
	}
	// recover status as a Job: the report, not a pass (no mode: status
	// changes nothing), with the pass's ServiceAccount.
	rs := one(t, docs, "Job", "recover-status-")
	var status batchv1.Job
	if err := strict(rs.raw, &status); err != nil {
		t.Fatal(err)
	}
	if ps := status.Spec.Template.Spec; !reflect.DeepEqual(ps.Containers[0].Args, []string{"status"}) || ps.ServiceAccountName != "gitea-dynamic-runner-recover" {
		t.Errorf("recover-status Job args %v, ServiceAccount %q: want [status], gitea-dynamic-runner-recover", ps.Containers[0].Args, ps.ServiceAccountName)
	}
	if env := envOf(t, path(rs.obj, "spec", "template", "spec")); env["GDR_RECOVER_MODE"] != "" {
		t.Errorf("recover-status GDR_RECOVER_MODE %q: want none", env["GDR_RECOVER_MODE"])
	}
	rc := one(t, docs, "CronJob", "recover")
	if env := envOf(t, path(rc.obj, "spec", "jobTemplate", "spec", "template", "spec")); env["GDR_RECOVER_MODE"] != "once" {
		t.Errorf("recover CronJob GDR_RECOVER_MODE %q: want once", env["GDR_RECOVER_MODE"])
	}
}

func TestPoolsConfigMap(t *testing.T) {
	docs := installed(loadManifests(t), "keda")
	var cm corev1.ConfigMap
	if err := strict(one(t, docs, "ConfigMap", "gdr-pools").raw, &cm); err != nil {
		t.Fatal(err)
	}
	data := cm.Data["pools.yaml"]
	dir := t.TempDir()
	file := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := runnerpool.Load(file, dir); err != nil {
		t.Fatalf("pools.yaml does not load: %v", err)
	}
	var pools struct {
		Pools []struct {
			Name    string `json:"name"`
			Backend string `json:"backend"`
			Profile struct {
				PodTemplate *corev1.PodTemplateSpec `json:"podTemplate"`
			} `json:"profile"`
		} `json:"pools"`
	}
	if err := yaml.Unmarshal([]byte(data), &pools); err != nil {
		t.Fatal(err)
	}
	var tmplRaw struct {
		Pools []struct {
			Profile map[string]any `json:"profile"`
		} `json:"pools"`
	}
	_ = yaml.Unmarshal([]byte(data), &tmplRaw)
	found := false
	for i, p := range pools.Pools {
		if p.Name != "linux" {
			continue
		}
		found = true
		if p.Backend != "pod" || p.Profile.PodTemplate == nil {
			t.Fatalf("pool linux: backend %q, podTemplate %v", p.Backend, p.Profile.PodTemplate != nil)
		}
		var strictTmpl corev1.PodTemplateSpec
		if err := strictValue(tmplRaw.Pools[i].Profile["podTemplate"], &strictTmpl); err != nil {
			t.Errorf("podTemplate: %v", err)
		}
		runner := false
		for _, c := range p.Profile.PodTemplate.Spec.Containers {
			runner = runner || (c.Name == "runner" && c.Image != "")
		}
		if !runner {
			t.Error("podTemplate has no container named runner with an image")
		}
	}
	if !found {
		t.Error("no pool named linux")
	}
}

// minSchedulingWait is the least time the Knative path keeps offering an assignment whose
// executor waits for a node (a node added by an autoscaler, a large image pulled), and
// maxOfferGap the longest a scheduled Pod may then wait for the next offer (10-channel.yaml).
const (
	minSchedulingWait = time.Hour
	maxOfferGap       = 5 * time.Minute
)

func TestKnativeContract(t *testing.T) {
	docs := under(loadManifests(t), "knative")
	ch := one(t, docs, "NatsJetStreamChannel", "")
	sub := one(t, docs, "Subscription", "handle-pod")

	if path(sub.obj, "spec", "channel", "kind") != "NatsJetStreamChannel" || path(sub.obj, "spec", "channel", "name") != ch.name() ||
		path(sub.obj, "spec", "channel", "apiVersion") != ch.apiVersion() {
		t.Errorf("subscription channel %v does not name %s", path(sub.obj, "spec", "channel"), ch)
	}
	if path(sub.obj, "spec", "subscriber", "ref", "kind") != "Service" || path(sub.obj, "spec", "subscriber", "ref", "name") != "handle" {
		t.Errorf("subscriber %v: want the Knative Service handle", path(sub.obj, "spec", "subscriber"))
	}

	ackWait, err := time.ParseDuration(fmt.Sprint(path(ch.obj, "spec", "consumerConfigTemplate", "ackWait")))
	if err != nil {
		t.Fatalf("consumerConfigTemplate.ackWait: %v", err)
	}
	maxDeliver, _ := path(ch.obj, "spec", "consumerConfigTemplate", "maxDeliver").(float64)
	for _, d := range []doc{sub, ch} {
		del, _ := path(d.obj, "spec", "delivery").(map[string]any)
		if del == nil {
			if d.kind() == "Subscription" {
				t.Errorf("%s: no delivery", d)
			}
			continue
		}
		timeout, err := channelenv.ParseISODuration(fmt.Sprint(del["timeout"]))
		if err != nil {
			t.Errorf("%s delivery.timeout: %v", d, err)
			continue
		}
		if ackWait != timeout+500*time.Millisecond {
			t.Errorf("%s: AckWait %v != delivery.timeout %v + 500ms", d, ackWait, timeout)
		}
		retry, _ := del["retry"].(float64)
		if maxDeliver != retry+1 {
			t.Errorf("%s: MaxDeliver %v != delivery.retry %v + 1", d, maxDeliver, retry)
		}
		if timeout > 600*time.Second {
			t.Errorf("%s: delivery.timeout %v over 600 s", d, timeout)
		}
	}

	// What the channel gives up on, and handle's rejection replies, reach recover's dead-letter
	// sink; a Subscription without them would drop both without a reason anyone reads.
	recoverSink := map[string]any{"ref": map[string]any{"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "recover"}, "uri": "/dead-letter"}
	for _, d := range []doc{sub, ch} {
		if got := path(d.obj, "spec", "delivery", "deadLetterSink"); !reflect.DeepEqual(got, recoverSink) {
			t.Errorf("%s: delivery.deadLetterSink %v, want %v", d, got, recoverSink)
		}
	}
	if got := path(sub.obj, "spec", "reply"); !reflect.DeepEqual(got, recoverSink) {
		t.Errorf("%s: reply %v, want %v (handle's rejection replies)", sub, got, recoverSink)
	}
	if !reflect.DeepEqual(path(sub.obj, "spec", "delivery"), path(ch.obj, "spec", "delivery")) {
		t.Errorf("the Subscription's delivery %v differs from the channel's %v", path(sub.obj, "spec", "delivery"), path(ch.obj, "spec", "delivery"))
	}
	// The delivery the stand-in channel runs with (one source of truth: this file) keeps a
	// waiting assignment offered for at least minSchedulingWait, with no gap between two offers
	// longer than maxOfferGap.
	del, err := channelenv.LoadDelivery(filepath.Join("knative", "10-channel.yaml"), sub.name())
	if err != nil {
		t.Fatal(err)
	}
	if del.Span() < minSchedulingWait {
		t.Errorf("delivery %+v offers a waiting assignment for %v in all, want at least %v", del, del.Span(), minSchedulingWait)
	}
	if gap := del.Backoff(del.Retry); gap > maxOfferGap {
		t.Errorf("delivery %+v: the last gap between two offers is %v, want at most %v", del, gap, maxOfferGap)
	}
	for _, subject := range []string{"dispatch", "recover"} {
		ok := false
		for _, sb := range find(docs, "SinkBinding", "") {
			if path(sb.obj, "spec", "subject", "kind") == "Service" && path(sb.obj, "spec", "subject", "name") == subject &&
				path(sb.obj, "spec", "subject", "apiVersion") == "serving.knative.dev/v1" &&
				path(sb.obj, "spec", "sink", "ref", "kind") == ch.kind() && path(sb.obj, "spec", "sink", "ref", "name") == ch.name() {
				ok = true
			}
		}
		if !ok {
			t.Errorf("no SinkBinding gives the Knative Service %s the channel %s as K_SINK", subject, ch)
		}
	}

	wantEnv := map[string]map[string]string{
		"handle":   {"GDR_MODE": "http", "GDR_BACKEND": "pod"},
		"recover":  {"GDR_RECOVER_MODE": "http", "GDR_PUBLISH": "cloudevents"},
		"dispatch": {"GDR_PUBLISH": "cloudevents"},
	}
	for name, want := range wantEnv {
		svc := one(t, docs, "Service", name)
		if svc.apiVersion() != "serving.knative.dev/v1" {
			t.Fatalf("%s: want a Knative Service", svc)
		}
		ann, _ := path(svc.obj, "spec", "template", "metadata", "annotations").(map[string]any)
		if ann["autoscaling.knative.dev/min-scale"] != "0" {
			t.Errorf("%s: min-scale %v, want \"0\"", svc, ann["autoscaling.knative.dev/min-scale"])
		}
		env := envOf(t, path(svc.obj, "spec", "template", "spec"))
		for k, v := range want {
			if env[k] != v {
				t.Errorf("%s: %s %q, want %q", svc, k, env[k], v)
			}
		}
		if ts, _ := path(svc.obj, "spec", "template", "spec", "timeoutSeconds").(float64); ts > 600 {
			t.Errorf("%s: timeoutSeconds %v over 600", svc, ts)
		}
	}
	for _, target := range []string{"recover", "dispatch"} {
		ok := false
		for _, ps := range find(docs, "PingSource", "") {
			ok = ok || (path(ps.obj, "spec", "sink", "ref", "kind") == "Service" && path(ps.obj, "spec", "sink", "ref", "name") == target)
		}
		if !ok {
			t.Errorf("no PingSource ticks the Knative Service %s", target)
		}
	}
	// A Service ticked every minute never reaches zero (Knative waits about 90 s without a
	// request): the ticks come every 5 minutes.
	for _, ps := range find(docs, "PingSource", "") {
		if s := path(ps.obj, "spec", "schedule"); s != "*/5 * * * *" {
			t.Errorf("PingSource %s schedule %v: want every 5 minutes", ps.name(), s)
		}
	}
	var disp corev1.Container
	if err := strictValue(path(one(t, docs, "Service", "dispatch").obj, "spec", "template", "spec", "containers").([]any)[0], &disp); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(disp.Args, []string{"serve"}) {
		t.Errorf("Knative dispatch args %v: want [serve]", disp.Args)
	}
}

// walk calls f on every map in v.
func walk(v any, f func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		f(x)
		for _, e := range x {
			walk(e, f)
		}
	case []any:
		for _, e := range x {
			walk(e, f)
		}
	}
}

// TestVariablesAndSecrets: every GDR_ variable the manifests set is in a
// table of docs/CONFIGURATION.md (which the functions' tests keep true to the
// code), and every Secret key they reference is one deploy/README.md creates.
func TestVariablesAndSecrets(t *testing.T) {
	config, err := os.ReadFile(filepath.Join("..", "docs", "CONFIGURATION.md"))
	if err != nil {
		t.Fatal(err)
	}
	used := map[string][]string{}
	secretKeys := map[string]bool{"bootstrap-key": true, "payload-key": true, "webhook-secret": true,
		"assignment-signing-key": true, "tick-token": true,
		// A rotation's other keys, added by docs/OPERATIONS.md's "Rotating secrets" (optional refs).
		"bootstrap-old-keys": true, "payload-old-keys": true, "webhook-old-secrets": true}
	for _, d := range loadManifests(t) {
		walk(d.obj, func(m map[string]any) {
			if n, ok := m["name"].(string); ok && strings.HasPrefix(n, "GDR_") {
				if _, v := m["value"]; v || m["valueFrom"] != nil {
					used[n] = append(used[n], d.String())
				}
			}
			if ref, ok := m["secretKeyRef"].(map[string]any); ok {
				if ref["name"] != "gdr-secrets" || !secretKeys[fmt.Sprint(ref["key"])] {
					t.Errorf("%s: secretKeyRef %v: want gdr-secrets with a key deploy/README.md has it created with", d, ref)
				}
			}
		})
		if d.kind() == "ConfigMap" {
			data, _ := d.obj["data"].(map[string]any)
			for k := range data {
				if strings.HasPrefix(k, "GDR_") {
					used[k] = append(used[k], d.String())
				}
			}
		}
	}
	if len(used) == 0 {
		t.Fatal("no GDR_ variable found in the manifests")
	}
	for name, where := range used {
		if !bytes.Contains(config, []byte("| `"+name+"` |")) {
			t.Errorf("%s (used in %v) is in no table of docs/CONFIGURATION.md", name, where)
		}
	}
}

// TestValidatorRejects makes sure the schema check bites: wrong types and unknown fields fail.
func TestValidatorRejects(t *testing.T) {
	crds := loadCRDs(t)
	sj := crds[crdKey("keda.sh/v1alpha1", "ScaledJob")]
	if sj.validator == nil {
		t.Fatal("no ScaledJob schema")
	}
	base := func() map[string]any {
		return map[string]any{
			"apiVersion": "keda.sh/v1alpha1",
			"kind":       "ScaledJob",
			"metadata":   map[string]any{"name": "x"},
			"spec": map[string]any{
				"pollingInterval": int64(2),
				"jobTargetRef": map[string]any{
					"template": map[string]any{"spec": map[string]any{
						"restartPolicy": "Never",
						"containers":    []any{map[string]any{"name": "handle", "image": "img"}},
					}},
				},
				"triggers": []any{map[string]any{
					"type":     "nats-jetstream",
					"metadata": map[string]any{"lagThreshold": "1"},
				}},
			},
		}
	}
	if errs := sj.validate(base()); len(errs) != 0 {
		t.Fatalf("the valid base is rejected: %v", errs)
	}
	cases := map[string]func(m map[string]any){
		"pollingInterval as a string": func(m map[string]any) { path(m, "spec").(map[string]any)["pollingInterval"] = "2" },
		"trigger metadata as a number": func(m map[string]any) {
			path(m, "spec", "triggers").([]any)[0].(map[string]any)["metadata"] = map[string]any{"lagThreshold": int64(1)}
		},
		"unknown field": func(m map[string]any) { path(m, "spec").(map[string]any)["pollingIntervall"] = int64(2) },
		"triggers missing type": func(m map[string]any) {
			delete(path(m, "spec", "triggers").([]any)[0].(map[string]any), "type")
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			m := base()
			mutate(m)
			if errs := sj.validate(m); len(errs) == 0 {
				t.Fatal("accepted")
			} else {
				t.Logf("rejected: %v", errs)
			}
		})
	}
	t.Run("built-in typo", func(t *testing.T) {
		bad := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 1\n")
		if err := strict(bad, &appsv1.Deployment{}); err == nil {
			t.Fatal("a Deployment with spec.replica was accepted")
		}
	})
	t.Run("knative channel ackWait as a number", func(t *testing.T) {
		ch := crds[crdKey("messaging.knative.dev/v1alpha1", "NatsJetStreamChannel")]
		m := map[string]any{"apiVersion": "messaging.knative.dev/v1alpha1", "kind": "NatsJetStreamChannel",
			"metadata": map[string]any{"name": "x"},
			"spec":     map[string]any{"consumerConfigTemplate": map[string]any{"ackWait": int64(30)}}}
		if errs := ch.validate(m); len(errs) == 0 {
			t.Fatal("accepted")
		}
	})
}

// TestRecoverFinishScaledJob: recover's finish mode runs as a ScaledJob on the finish notices'
// consumer of the backend handle-setup serves, with the CronJob's identity, and long enough for
// its fetch (a SIGTERM hands the notices back only once the fetch has ended).
func TestRecoverFinishScaledJob(t *testing.T) {
	docs := under(loadManifests(t), "keda")
	sj := one(t, docs, "ScaledJob", "recover-finish")
	spec := sj.obj["spec"].(map[string]any)
	podSpec := path(spec, "jobTargetRef", "template", "spec")
	env := envOf(t, podSpec)
	if env["GDR_RECOVER_MODE"] != "finish" {
		t.Errorf("GDR_RECOVER_MODE %q: want finish", env["GDR_RECOVER_MODE"])
	}
	fetch, err := time.ParseDuration(env["GDR_RECOVER_FETCH_WAIT"])
	if err != nil {
		t.Fatalf("GDR_RECOVER_FETCH_WAIT %q: %v", env["GDR_RECOVER_FETCH_WAIT"], err)
	}
	deadline, _ := path(spec, "jobTargetRef", "activeDeadlineSeconds").(float64)
	if time.Duration(deadline)*time.Second <= fetch+time.Minute {
		t.Errorf("activeDeadlineSeconds %v: want more than GDR_RECOVER_FETCH_WAIT %v and a minute of Finish calls", deadline, fetch)
	}
	grace, _ := path(podSpec, "terminationGracePeriodSeconds").(float64)
	if time.Duration(grace)*time.Second <= fetch {
		t.Errorf("terminationGracePeriodSeconds %v: want more than GDR_RECOVER_FETCH_WAIT %v", grace, fetch)
	}
	cron := one(t, docs, "CronJob", "recover")
	cronSpec := path(cron.obj, "spec", "jobTemplate", "spec", "template", "spec")
	for _, k := range []string{"serviceAccountName", "automountServiceAccountToken"} {
		if path(podSpec, k) != path(cronSpec, k) {
			t.Errorf("%s %v: want the recover CronJob's %v", k, path(podSpec, k), path(cronSpec, k))
		}
	}
	setup := envOf(t, path(one(t, docs, "Job", "handle-setup").obj, "spec", "template", "spec"))
	triggers, _ := spec["triggers"].([]any)
	if len(triggers) != 1 {
		t.Fatalf("want one trigger, have %d", len(triggers))
	}
	tr := triggers[0].(map[string]any)
	md, _ := tr["metadata"].(map[string]any)
	want := map[string]string{
		"account":                "$G",
		"stream":                 assignmentqueue.DefaultStream + assignmentqueue.FinishedSuffix,
		"consumer":               setup["GDR_BACKEND"], // handle-setup creates it
		"lagThreshold":           "1",
		"activationLagThreshold": "0",
	}
	if tr["type"] != "nats-jetstream" {
		t.Errorf("trigger type %v: want nats-jetstream", tr["type"])
	}
	for k, v := range want {
		if md[k] != v {
			t.Errorf("trigger metadata %s = %v, want %q", k, md[k], v)
		}
	}
}
