package deploy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// podTemplate is one Pod spec of the manifests: a workload's template, a Knative Service's
// revision template or the executor template of a pool in the gdr-pools ConfigMap.
type podTemplate struct {
	doc  doc
	path string // where in the document, e.g. spec.jobTemplate.spec.template
	// labels are those of the Pods it makes (Knative adds serving.knative.dev/service).
	labels  map[string]string
	spec    corev1.PodSpec
	knative bool
	// pool is the pool name for an executor template, else "".
	pool string
}

func (p podTemplate) String() string { return fmt.Sprintf("%s %s", p.doc, p.path) }

// env returns the first container's literal variables and those taken from elsewhere.
func (p podTemplate) env() map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	if len(p.spec.Containers) > 0 {
		for _, e := range p.spec.Containers[0].Env {
			out[e.Name] = e
		}
	}
	return out
}

// function is the function a control-plane template runs (its container's command), "executor"
// for a pool's template.
func (p podTemplate) function() string {
	if p.pool != "" {
		return "executor"
	}
	if len(p.spec.Containers) == 0 || len(p.spec.Containers[0].Command) == 0 {
		return ""
	}
	return p.spec.Containers[0].Command[0]
}

// podTemplatePaths are where each kind keeps its Pod template.
var podTemplatePaths = map[string][]string{
	"Deployment": {"spec", "template"},
	"Job":        {"spec", "template"},
	"CronJob":    {"spec", "jobTemplate", "spec", "template"},
	"ScaledJob":  {"spec", "jobTargetRef", "template"},
	"Service":    {"spec", "template"}, // serving.knative.dev only
}

// podTemplates returns every Pod template of docs. It fails the test on a document that holds a
// container list it does not know how to reach, so that a new kind cannot slip past the checks
// made on the templates.
func podTemplates(t *testing.T, docs []doc) []podTemplate {
	t.Helper()
	var out []podTemplate
	for _, d := range docs {
		found := 0
		switch {
		case d.kind() == "ConfigMap" && d.name() == "gdr-pools":
			tmpls := poolTemplates(t, d)
			out = append(out, tmpls...)
			found = len(tmpls)
		case d.kind() == "Service" && d.apiVersion() != "serving.knative.dev/v1":
		case podTemplatePaths[d.kind()] != nil:
			keys := podTemplatePaths[d.kind()]
			tmpl, ok := path(d.obj, keys...).(map[string]any)
			if !ok {
				t.Fatalf("%s: no Pod template at %s", d, strings.Join(keys, "."))
			}
			p := podTemplate{doc: d, path: strings.Join(keys, "."), knative: d.kind() == "Service"}
			p.labels = stringMap(path(tmpl, "metadata", "labels"))
			if p.knative {
				p.labels["serving.knative.dev/service"] = d.name()
			}
			spec, _ := runtime.DeepCopyJSONValue(tmpl["spec"]).(map[string]any)
			delete(spec, "containerConcurrency") // Knative's own fields
			delete(spec, "timeoutSeconds")
			if err := strictValue(spec, &p.spec); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			out = append(out, p)
			found = 1
		}
		lists := 0
		walk(d.obj, func(m map[string]any) {
			if _, ok := m["containers"].([]any); ok {
				lists++
			}
		})
		if d.kind() == "ConfigMap" {
			lists = found // the executor templates are YAML inside a string
		}
		if lists != found {
			t.Fatalf("%s: %d container lists, %d Pod templates found: teach podTemplates this kind", d, lists, found)
		}
	}
	return out
}

// poolTemplates returns the pod templates of the pools in the gdr-pools ConfigMap.
func poolTemplates(t *testing.T, d doc) []podTemplate {
	t.Helper()
	data, _ := path(d.obj, "data", "pools.yaml").(string)
	var pools struct {
		Pools []struct {
			Name    string         `json:"name"`
			Profile map[string]any `json:"profile"`
		} `json:"pools"`
	}
	if err := yaml.Unmarshal([]byte(data), &pools); err != nil {
		t.Fatalf("%s: pools.yaml: %v", d, err)
	}
	var out []podTemplate
	for i, p := range pools.Pools {
		raw, ok := p.Profile["podTemplate"]
		if !ok {
			continue
		}
		var tmpl corev1.PodTemplateSpec
		if err := strictValue(raw, &tmpl); err != nil {
			t.Fatalf("%s: pool %s: %v", d, p.Name, err)
		}
		out = append(out, podTemplate{doc: d, path: fmt.Sprintf("pools[%d] (%s).profile.podTemplate", i, p.Name),
			labels: maps.Clone(tmpl.Labels), spec: tmpl.Spec, pool: p.Name})
	}
	return out
}

func stringMap(v any) map[string]string {
	out := map[string]string{}
	m, _ := v.(map[string]any)
	for k, x := range m {
		out[k] = fmt.Sprint(x)
	}
	return out
}

// allContainers returns the init and regular containers of spec.
func allContainers(spec corev1.PodSpec) []corev1.Container {
	return slices.Concat(spec.InitContainers, spec.Containers)
}
