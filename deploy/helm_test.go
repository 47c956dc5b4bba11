package deploy

import (
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/release"
	"k8s.io/apimachinery/pkg/util/diff"
	"sigs.k8s.io/yaml"
)

// chartDir is the Helm chart of the install (deploy/README.md, "Helm").
var chartDir = filepath.Join("helm", "gitea-dynamic-runner")

// kubeVersion is the Kubernetes version the chart is rendered for: the test cluster's
// (docs/CLUSTER.md).
const kubeVersion = "v1.37.2"

// helmLabels are the labels the chart adds to every object's own metadata, and the only ones it
// adds: selectors and Pod templates stay as the kustomize install has them.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by"}

// renderChart renders the chart as `helm template` does (Helm's own install action, client
// only: the values schema checked, nothing sent anywhere) into namespace ns with vals.
func renderChart(t testing.TB, ns string, vals map[string]any) ([]doc, error) {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load the chart %s: %v", chartDir, err)
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = "gdr"
	install.Namespace = ns
	install.Replace = true
	kube, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	install.KubeVersion = kube
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return nil, err
	}
	acc, err := release.NewAccessor(rel)
	if err != nil {
		t.Fatal(err)
	}
	raws, err := splitDocs([]byte(acc.Manifest()))
	if err != nil {
		t.Fatalf("the rendered chart: %v", err)
	}
	var docs []doc
	for _, raw := range raws {
		var obj map[string]any
		if err := yaml.Unmarshal(raw, &obj); err != nil {
			t.Fatalf("a rendered document: %v\n%s", err, raw)
		}
		docs = append(docs, doc{file: "helm", raw: raw, obj: obj})
	}
	return docs, nil
}

// mustRenderChart is renderChart failing the test on an error.
func mustRenderChart(t testing.TB, ns string, vals map[string]any) []doc {
	t.Helper()
	docs, err := renderChart(t, ns, vals)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return docs
}

// comparable returns obj as the in-step comparison sees it, the intended differences between
// the chart and the kustomize install taken out:
//   - Helm's labels (helmLabels) on the object's own metadata;
//   - the pools file of gdr-pools compared as data: the chart renders structured values, so
//     the comments of deploy/base/00-config.yaml are not in it.
func comparable(t testing.TB, obj map[string]any) map[string]any {
	t.Helper()
	out, err := deepCopy(obj)
	if err != nil {
		t.Fatal(err)
	}
	if labels, ok := path(out, "metadata", "labels").(map[string]any); ok {
		for _, l := range helmLabels {
			delete(labels, l)
		}
	}
	if path(out, "kind") == "ConfigMap" && path(out, "metadata", "name") == "gdr-pools" {
		data := path(out, "data").(map[string]any)
		var pools any
		if err := yaml.Unmarshal([]byte(data["pools.yaml"].(string)), &pools); err != nil {
			t.Fatalf("gdr-pools: %v", err)
		}
		data["pools.yaml"] = pools
	}
	return out
}

// deepCopy copies a decoded YAML document.
func deepCopy(obj map[string]any) (map[string]any, error) {
	raw, err := yaml.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	return out, yaml.Unmarshal(raw, &out)
}

// byKey indexes docs by "Kind name".
func byKey(docs []doc) map[string]doc {
	out := map[string]doc{}
	for _, d := range docs {
		out[d.kind()+" "+d.name()] = d
	}
	return out
}

// stepProblems compares the chart's documents with kustomize's, object by object: the same
// objects (kind and name), and each one equal but for the intended differences (comparable).
func stepProblems(t testing.TB, chart, kustomize []doc) []string {
	t.Helper()
	var probs []string
	if got, want := objectKeys(chart), objectKeys(kustomize); !slices.Equal(got, want) {
		probs = append(probs, fmt.Sprintf("the chart renders\n  %v\nkustomize builds\n  %v", got, want))
	}
	k := byKey(kustomize)
	for _, key := range slices.Sorted(maps.Keys(byKey(chart))) {
		want, ok := k[key]
		if !ok {
			continue
		}
		got := byKey(chart)[key]
		g, w := comparable(t, got.obj), comparable(t, want.obj)
		if !reflect.DeepEqual(g, w) {
			probs = append(probs, fmt.Sprintf("%s differs (- kustomize, + chart):\n%s", key, diff.Diff(w, g)))
		}
	}
	return probs
}

// TestHelmChartMatchesKustomize renders the chart with the real Helm (v4's install action, client
// only) and builds the kustomize install with the real kustomize, for each install path: the
// same objects, and each one the same (RBAC rules, containers, security contexts, volumes,
// network policies, ...) but for Helm's labels and the pools file's comments (comparable). The
// default values give deploy/keda as shipped; the other cases set, in both, what an installer
// sets: the namespace and images, the cache component, the Knative path.
func TestHelmChartMatchesKustomize(t *testing.T) {
	cases := []struct {
		name string
		// dir is the kustomization; components are enabled in it.
		dir        string
		components []string
		// namespace, registry and tag: override() in the kustomization ("": as shipped).
		namespace, registry, tag string
		vals                     map[string]any
	}{
		{name: "keda", dir: "keda"},
		{name: "keda/cache", dir: "keda", components: []string{"cache"}, vals: map[string]any{"cache": map[string]any{"enabled": true}}},
		{
			name: "keda/namespace-and-images", dir: "keda", namespace: "ci-runners", registry: "registry.example.net/gdr", tag: "v1.2.3",
			vals: map[string]any{"images": map[string]any{"registry": "registry.example.net/gdr", "tag": "v1.2.3"}},
		},
		{
			// The kustomize install leaves the token to envsubst: the chart's value stands in
			// for it here.
			name: "knative", dir: "knative",
			vals: map[string]any{"scaler": "knative", "knative": map[string]any{"tickToken": "${GDR_TICK_TOKEN}"}},
		},
		{
			name: "knative/cache", dir: "knative", components: []string{"cache"},
			vals: map[string]any{"scaler": "knative", "knative": map[string]any{"tickToken": "${GDR_TICK_TOKEN}"}, "cache": map[string]any{"enabled": true}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := copyDeploy(t)
			dir := filepath.Join(root, c.dir)
			ns := installNamespace
			if c.namespace != "" {
				ns = c.namespace
				override(t, dir, c.namespace, c.registry, c.tag)
			}
			for _, comp := range c.components {
				enableComponent(t, dir, comp)
			}
			kustomize := buildKustomization(t, dir)
			chart := mustRenderChart(t, ns, c.vals)
			if probs := namespaceProblems(chart, ns); len(probs) > 0 {
				t.Errorf("namespace %s:\n%s", ns, strings.Join(probs, "\n"))
			}
			if probs := stepProblems(t, chart, kustomize); len(probs) > 0 {
				t.Errorf("the chart and %s are out of step:\n%s", c.name, strings.Join(probs, "\n"))
			}
			for _, d := range chart {
				labels, _ := path(d.obj, "metadata", "labels").(map[string]any)
				for _, l := range helmLabels {
					if labels[l] == nil {
						t.Errorf("%s: no label %s", d, l)
					}
				}
			}
		})
	}
}

// TestHelmChartComparisonSeesDrift checks that the in-step comparison fails where it should: a
// changed RBAC verb, a changed security context, a missing object and an extra label each
// yield a problem naming the object.
func TestHelmChartComparisonSeesDrift(t *testing.T) {
	kustomize := buildKustomization(t, "keda")
	cases := []struct {
		name   string
		change func(t *testing.T, docs []doc) []doc
		want   string
	}{
		{"rbac verb", func(t *testing.T, docs []doc) []doc {
			role := byKey(docs)["Role gitea-dynamic-runner-handle"].obj
			rule := path(role, "rules").([]any)[0].(map[string]any)
			rule["verbs"] = append(rule["verbs"].([]any), "delete")
			return docs
		}, "Role gitea-dynamic-runner-handle differs"},
		{"security context", func(t *testing.T, docs []doc) []doc {
			dep := byKey(docs)["Deployment gateway"].obj
			c := path(dep, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
			c["securityContext"].(map[string]any)["readOnlyRootFilesystem"] = false
			return docs
		}, "Deployment gateway differs"},
		{"missing object", func(t *testing.T, docs []doc) []doc {
			return slices.DeleteFunc(docs, func(d doc) bool { return d.kind() == "NetworkPolicy" && d.name() == "gdr-gateway" })
		}, "the chart renders"},
		{"pod template label", func(t *testing.T, docs []doc) []doc {
			dep := byKey(docs)["Deployment dispatch"].obj
			path(dep, "spec", "template", "metadata", "labels").(map[string]any)["app.kubernetes.io/instance"] = "gdr"
			return docs
		}, "Deployment dispatch differs"},
	}
	if probs := stepProblems(t, mustRenderChart(t, installNamespace, nil), kustomize); len(probs) > 0 {
		t.Fatalf("unchanged: %v", probs)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			chart := c.change(t, mustRenderChart(t, installNamespace, nil))
			probs := stepProblems(t, chart, kustomize)
			if len(probs) == 0 || !strings.Contains(strings.Join(probs, "\n"), c.want) {
				t.Errorf("problems %q, want one with %q", probs, c.want)
			}
		})
	}
}

// TestHelmValuesRefused checks that values.schema.json refuses a wrong value with a message
// naming it, and that the templates refuse what the schema cannot see.
func TestHelmValuesRefused(t *testing.T) {
	cases := []struct {
		name string
		vals map[string]any
		want string
	}{
		{"unknown scaler", map[string]any{"scaler": "hpa"}, "scaler"},
		{"misspelt key", map[string]any{"nats": map[string]any{"ulr": "nats://x:4222"}}, "ulr"},
		{"replicas", map[string]any{"nats": map[string]any{"replicas": 2}}, "replicas"},
		{"nats url scheme", map[string]any{"nats": map[string]any{"url": "http://nats:4222"}}, "url"},
		{"gitea url", map[string]any{"gitea": map[string]any{"url": ""}}, "url"},
		{"capacity", map[string]any{"handle": map[string]any{"capacity": 0}}, "capacity"},
		{"pull policy", map[string]any{"images": map[string]any{"pullPolicy": "Sometimes"}}, "pullPolicy"},
		{"pool without a name", map[string]any{"pools": []any{map[string]any{"labels": []any{"x"}, "backend": "pod"}}}, "name"},
		{"pool backend", map[string]any{"pools": []any{map[string]any{"name": "a", "labels": []any{"x"}, "backend": "vm"}}}, "backend"},
		{"knative without its token", map[string]any{"scaler": "knative"}, "knative.tickToken"},
		{"both workload API sources", map[string]any{"spire": map[string]any{"workloadAPI": map[string]any{"hostPath": "/run/spire"}}}, "workloadAPI"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := renderChart(t, installNamespace, c.vals)
			if err == nil {
				t.Fatalf("rendered with %v", c.vals)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name %q", err, c.want)
			}
			t.Logf("refused: %v", err)
		})
	}
	if _, err := renderChart(t, installNamespace, map[string]any{"spire": map[string]any{"workloadAPI": map[string]any{"csiDriver": "", "hostPath": "/run/spire/agent-sockets"}}}); err != nil {
		t.Errorf("hostPath alone: %v", err)
	}
}

// TestHelmChartLints runs Helm's own linter (helm lint --strict) on the chart, for each scaler:
// no warning or error.
func TestHelmChartLints(t *testing.T) {
	kube, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, vals := range []map[string]any{
		nil,
		{"scaler": "knative", "knative": map[string]any{"tickToken": "token"}, "cache": map[string]any{"enabled": true}},
	} {
		lint := action.NewLint()
		lint.Strict = true
		lint.Namespace = installNamespace
		lint.KubeVersion = kube
		res := lint.Run([]string{chartDir}, vals)
		for _, err := range res.Errors {
			t.Errorf("helm lint %v: %v", vals, err)
		}
		for _, m := range res.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint %v: %v", vals, m)
			}
		}
		if res.TotalChartsLinted != 1 {
			t.Errorf("linted %d charts", res.TotalChartsLinted)
		}
	}
}
