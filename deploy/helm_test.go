package deploy

import (
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/getter"
	"helm.sh/helm/v4/pkg/release"
	corev1 "k8s.io/api/core/v1"
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
	manifest, err := renderManifest(t, ns, vals)
	if err != nil {
		return nil, err
	}
	raws, err := splitDocs([]byte(manifest))
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

// renderManifest is renderChart's text, as `helm template` prints it.
func renderManifest(t testing.TB, ns string, vals map[string]any) (string, error) {
	t.Helper()
	acc, err := renderRelease(t, ns, vals)
	if err != nil {
		return "", err
	}
	return acc.Manifest(), nil
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

// chartOnly reports whether d is one of the chart's own objects, which the kustomize install
// has no counterpart of: the keys Job (and its CronJob, ServiceAccount, Role and RoleBinding),
// whose work the kustomize install's operator does by hand (`dispatch keygen`, kubectl).
func chartOnly(d doc) bool {
	switch d.kind() {
	case "ServiceAccount", "Role", "RoleBinding":
		return d.name() == "gitea-dynamic-runner-keys"
	case "Job", "CronJob":
		return path(d.obj, "metadata", "labels", "app.kubernetes.io/name") == "keys"
	}
	return false
}

// stepProblems compares the chart's documents with kustomize's, object by object: the same
// objects (kind and name), and each one equal but for the intended differences (comparable);
// the chart's own objects (chartOnly) aside.
func stepProblems(t testing.TB, chart, kustomize []doc) []string {
	t.Helper()
	chart = slices.DeleteFunc(slices.Clone(chart), chartOnly)
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
// sets: the namespace and images, the executors' namespace, the cache component, the Knative
// path.
func TestHelmChartMatchesKustomize(t *testing.T) {
	cases := []struct {
		name string
		// dir is the kustomization; components are enabled in it.
		dir        string
		components []string
		// namespace, registry and tag: override() in the kustomization ("": as shipped).
		namespace, registry, tag string
		// executors: setExecutorsNamespace() in the kustomization ("": as shipped).
		executors string
		vals      map[string]any
	}{
		{name: "keda", dir: "keda"},
		{name: "keda/cache", dir: "keda", components: []string{"cache"}, vals: map[string]any{"cache": map[string]any{"enabled": true}}},
		{
			name: "keda/workload-api", dir: "keda", components: []string{"workload-api"},
			vals: map[string]any{"spire": map[string]any{"podIdentity": "workload-api"}},
		},
		{
			name: "knative/workload-api", dir: "knative", components: []string{"workload-api"},
			vals: map[string]any{"scaler": "knative", "knative": map[string]any{"tickToken": "${GDR_TICK_TOKEN}"}, "spire": map[string]any{"podIdentity": "workload-api"}},
		},
		{
			name: "keda/namespace-and-images", dir: "keda", namespace: "ci-runners", registry: "registry.example.net/gdr", tag: "v1.2.3",
			vals: map[string]any{"images": map[string]any{"registry": "registry.example.net/gdr", "tag": "v1.2.3"}},
		},
		{
			name: "keda/executors-namespace", dir: "keda", namespace: "ci-runners", executors: "ci-runners-executors",
			vals: map[string]any{"executors": map[string]any{"namespace": "ci-runners-executors"}},
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
			jobs := jobsNamespace
			if c.executors != "" {
				jobs = c.executors
				setExecutorsNamespace(t, dir, c.executors)
			}
			for _, comp := range c.components {
				enableComponent(t, dir, comp)
			}
			kustomize := buildKustomization(t, dir)
			chart := mustRenderChart(t, ns, c.vals)
			if probs := namespaceProblems(slices.DeleteFunc(slices.Clone(chart), chartOnly), ns, jobs); len(probs) > 0 {
				t.Errorf("namespaces %s and %s:\n%s", ns, jobs, strings.Join(probs, "\n"))
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
		{"max in flight", map[string]any{"handle": map[string]any{"maxInFlight": 0}}, "maxInFlight"},
		{"pull policy", map[string]any{"images": map[string]any{"pullPolicy": "Sometimes"}}, "pullPolicy"},
		{"digest not sha256", map[string]any{"images": map[string]any{"digests": map[string]any{"handle": "latest"}}}, "handle"},
		{"digest of no function", map[string]any{"images": map[string]any{"digests": map[string]any{"runner": "sha256:" + strings.Repeat("a", 64)}}}, "runner"},
		{"pool without a name", map[string]any{"pools": []any{map[string]any{"labels": []any{"x"}, "backend": "pod"}}}, "name"},
		{"pool backend", map[string]any{"pools": []any{map[string]any{"name": "a", "labels": []any{"x"}, "backend": "vm"}}}, "backend"},
		{"knative without its token", map[string]any{"scaler": "knative"}, "knative.tickToken"},
		{"both workload API sources", map[string]any{"spire": map[string]any{"workloadAPI": map[string]any{"hostPath": "/run/spire"}}}, "workloadAPI"},
		{"executors in the release's namespace", map[string]any{"executors": map[string]any{"namespace": installNamespace}}, "executors.namespace"},
		{"executors' namespace not a name", map[string]any{"executors": map[string]any{"namespace": "CI_Jobs"}}, "namespace"},
		{"executors' namespace empty", map[string]any{"executors": map[string]any{"namespace": ""}}, "namespace"},
		{"push URL with credentials", map[string]any{"metrics": map[string]any{"pushURL": "http://ci:pw@pushgateway:9091"}}, "pushURL"},
		{"push URL without a scheme", map[string]any{"metrics": map[string]any{"pushURL": "pushgateway:9091"}}, "pushURL"},
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

// TestHelmValuesRender checks what the values without a kustomize counterpart in the in-step
// cases render: NATS TLS' files in gdr-config, the Workload API from the agent's socket
// folder, the pull policy, the gateway's address, the handle's max in flight and Jobs, Prometheus'
// and Gitea's selectors, the cache claim.
func TestHelmValuesRender(t *testing.T) {
	const tlsDir = "/var/run/secrets/gitea-dynamic-runner/nats/"
	cases := []struct {
		name string
		vals map[string]any
		// key is "Kind name"; at the path in it, want (nil: absent).
		key  string
		at   []string
		want any
	}{
		{"nats tls ca", map[string]any{"nats": map[string]any{"url": "tls://nats:4222", "tls": map[string]any{"enabled": true}}},
			"ConfigMap gdr-config", []string{"data", "GDR_NATS_TLS_CA"}, tlsDir + "ca.crt"},
		{"nats tls no client certificate", map[string]any{"nats": map[string]any{"tls": map[string]any{"enabled": true}}},
			"ConfigMap gdr-config", []string{"data", "GDR_NATS_TLS_CERT"}, nil},
		{"nats mutual tls", map[string]any{"nats": map[string]any{"tls": map[string]any{"enabled": true, "ca": false, "clientCertificate": true}}},
			"ConfigMap gdr-config", []string{"data", "GDR_NATS_TLS_KEY"}, tlsDir + "tls.key"},
		{"nats tls off", nil, "ConfigMap gdr-config", []string{"data", "GDR_NATS_TLS_CA"}, nil},
		{"gateway spiffe id from the trust domain", map[string]any{"spire": map[string]any{"trustDomain": "corp.example"}},
			"ConfigMap gdr-config", []string{"data", "GDR_GATEWAY_SPIFFE_ID"}, "spiffe://corp.example/gateway"},
		{"workload API by hostPath", map[string]any{"spire": map[string]any{"workloadAPI": map[string]any{"csiDriver": "", "hostPath": "/run/spire/sockets"}}},
			"Deployment gateway", []string{"spec", "template", "spec", "volumes", "spiffe-workload-api", "hostPath", "path"}, "/run/spire/sockets"},
		{"pull policy", map[string]any{"images": map[string]any{"pullPolicy": "IfNotPresent"}},
			"Deployment dispatch", []string{"spec", "template", "spec", "containers", "dispatch", "imagePullPolicy"}, "IfNotPresent"},
		{"recover schedule", map[string]any{"recover": map[string]any{"schedule": "*/15 * * * *"}},
			"CronJob recover", []string{"spec", "schedule"}, "*/15 * * * *"},
		{"dispatch wakes on every label of the pools", map[string]any{"pools": []any{
			map[string]any{"name": "a", "labels": []any{"x", "y"}, "backend": "pod"}, map[string]any{"name": "b", "labels": []any{"y", `z"q`}, "backend": "pod"}}},
			"ScaledObject dispatch", []string{"spec", "triggers", "3", "metadata", "valueLocation"}, `jobs.#(labels.#(=="z\"q"))#|#`},
		{"dispatch reads an organization's queue", map[string]any{"dispatch": map[string]any{"queuedJobsPath": "api/v1/orgs/acme/actions/jobs"}},
			"ScaledObject dispatch", []string{"spec", "triggers", "1", "metadata", "url"}, "https://gitea.example.com/api/v1/orgs/acme/actions/jobs?status=queued&limit=50"},
		{"gateway tasks per replica", map[string]any{"gateway": map[string]any{"tasksPerReplica": 5}},
			"ScaledObject gateway", []string{"spec", "triggers", "0", "metadata", "lagThreshold"}, "5"},
		{"gateway replicas on knative", map[string]any{"scaler": "knative", "knative": map[string]any{"tickToken": "t"}, "gateway": map[string]any{"replicas": 3}},
			"Deployment gateway", []string{"spec", "replicas"}, float64(3)},
		{"gateway scaled by KEDA on knative", map[string]any{"scaler": "knative", "knative": map[string]any{"tickToken": "t"}, "gateway": map[string]any{"kedaOnKnative": true}},
			"ScaledObject gateway", []string{"spec", "minReplicaCount"}, float64(0)},
		{"no gateway replicas under KEDA on knative", map[string]any{"scaler": "knative", "knative": map[string]any{"tickToken": "t"}, "gateway": map[string]any{"kedaOnKnative": true}},
			"Deployment gateway", []string{"spec", "replicas"}, nil},
		{"gateway clusterIP", map[string]any{"gateway": map[string]any{"service": map[string]any{"clusterIP": "10.0.0.9"}}},
			"Service gateway", []string{"spec", "clusterIP"}, "10.0.0.9"},
		{"handle max in flight", map[string]any{"handle": map[string]any{"maxInFlight": 4}},
			"Job handle-setup", []string{"spec", "template", "spec", "containers", "handle", "env", "GDR_MAX_IN_FLIGHT", "value"}, "4"},
		{"handle jobs", map[string]any{"handle": map[string]any{"maxReplicas": 3}},
			"ScaledJob handle-pod", []string{"spec", "maxReplicaCount"}, float64(3)},
		{"prometheus", map[string]any{"metrics": map[string]any{"prometheus": map[string]any{"namespace": "obs", "podLabels": map[string]any{"app": "prom"}}}},
			"NetworkPolicy gdr-metrics-gateway", []string{"spec", "ingress", "0", "from", "0", "podSelector", "matchLabels", "app"}, "prom"},
		{"gitea namespace", map[string]any{"gitea": map[string]any{"namespace": "forge"}},
			"NetworkPolicy gdr-dispatch-webhook", []string{"spec", "ingress", "0", "from", "0", "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name"}, "forge"},
		{"cache claim", map[string]any{"cache": map[string]any{"enabled": true, "accessMode": "ReadWriteOnce", "storageClassName": "fast", "size": "5Gi"}},
			"PersistentVolumeClaim gdr-cache", []string{"spec", "storageClassName"}, "fast"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, ok := byKey(mustRenderChart(t, installNamespace, c.vals))[c.key]
			if !ok {
				t.Fatalf("no %s rendered", c.key)
			}
			if got := lookup(d.obj, c.at); !reflect.DeepEqual(got, c.want) {
				t.Errorf("%s %v: %#v, want %#v", c.key, c.at, got, c.want)
			}
		})
	}
}

// lookup follows keys into obj: a map key, a list index, or in a list of objects the one with
// that name.
func lookup(obj any, keys []string) any {
	for _, k := range keys {
		switch v := obj.(type) {
		case map[string]any:
			obj = v[k]
		case []any:
			obj = nil
			for i, e := range v {
				if m, ok := e.(map[string]any); (ok && m["name"] == k) || fmt.Sprint(i) == k {
					obj = e
					break
				}
			}
		default:
			return nil
		}
	}
	return obj
}

// TestHelmInstallStepsSetEveryValue runs deploy/README.md's Helm install block with a helm
// that records its arguments (and a kubectl that does nothing), merges the values it passes as
// the CLI does (Helm's own values.Options: the --set flags over -f my-values.yaml, empty here)
// and renders this checkout's chart with them: every value must land where the functions read
// it, with identity ca and the registration Secret wired, and no placeholder of a setting may
// be left. TestE2EClusterHelmBuiltinIdentity runs the same block with the real helm.
func TestHelmInstallStepsSetEveryValue(t *testing.T) {
	var install string
	for _, b := range readmePhase(t, "helm") {
		if b.name == "install" {
			install = b.text
		}
	}
	if install == "" {
		t.Fatal("README.md has no helm install block")
	}
	root := t.TempDir()
	env := map[string]string{"REG": "registry.test/ci", "VERSION": "v9.1.0", "GITEA": "https://git.test/",
		"NATS": "nats://n.test:4222", "NATS_MONITOR": "n.test:8222", "NATS_REPLICAS": "5"}
	environ := os.Environ()
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	if err := os.WriteFile(filepath.Join(root, "my-values.yaml"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	shims := "helm() { printf '%s\\n' \"$@\" > helm.args; }\nkubectl() { :; }\n"
	c := exec.Command("bash", "-euo", "pipefail", "-c", shims+install)
	c.Dir, c.Env = root, environ
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("the install block: %v\n%s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(root, "helm.args"))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	start := []string{"install", "gdr", "oci://registry.test/ci/gitea-dynamic-runner", "--version", "9.1.0", "-n", installNamespace}
	if !slices.Equal(args[:min(len(args), len(start))], start) {
		t.Fatalf("helm %q, want it to start %q", args, start)
	}
	var opts values.Options
	for i := len(start); i < len(args); i++ {
		switch args[i] {
		case "--set":
			i++
			opts.Values = append(opts.Values, args[i])
		case "-f":
			i++
			opts.ValueFiles = append(opts.ValueFiles, filepath.Join(root, args[i]))
		default:
			t.Fatalf("helm install argument %q: not a --set or -f", args[i])
		}
	}
	vals, err := opts.MergeValues(getter.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := renderManifest(t, installNamespace, vals)
	if err != nil {
		t.Fatalf("helm template with the block's values: %v", err)
	}
	for _, left := range []string{"nats.nats.svc", "gitea.example.com"} {
		if strings.Contains(manifest, left) {
			t.Errorf("the chart still renders %q with the block's values", left)
		}
	}
	docs := byKey(mustRenderChart(t, installNamespace, vals))
	cfg := path(docs["ConfigMap gdr-config"].obj, "data").(map[string]any)
	for k, want := range map[string]string{
		"GDR_NATS_URL": env["NATS"], "GDR_NATS_REPLICAS": env["NATS_REPLICAS"], "GDR_GITEA_URL": env["GITEA"], "GDR_POD_IDENTITY": "ca",
	} {
		if cfg[k] != want {
			t.Errorf("gdr-config %s = %q, want %q", k, cfg[k], want)
		}
	}
	if !strings.Contains(manifest, "gdr-registration-token") {
		t.Error("the keys Job does not read the registration token Secret the block names")
	}
	if got := path(docs["ScaledJob handle-pod"].obj, "spec", "triggers").([]any)[0].(map[string]any)["metadata"].(map[string]any)["natsServerMonitoringEndpoint"]; got != env["NATS_MONITOR"] {
		t.Errorf("natsServerMonitoringEndpoint %v, want %s", got, env["NATS_MONITOR"])
	}
}

// TestHelmPrometheusRule: the chart ships no PrometheusRule by default (the kind needs the
// Prometheus Operator); with metrics.prometheusRule.enabled it renders deploy/prometheus's rule
// file as it is (the same name and groups, its {{ $labels }} templates left for Prometheus),
// with Helm's labels and the selector labels and namespace it is given.
func TestHelmPrometheusRule(t *testing.T) {
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]any
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	rule := func(vals map[string]any) map[string]any {
		t.Helper()
		var rules []doc
		for _, d := range mustRenderChart(t, installNamespace, vals) {
			if d.kind() == "PrometheusRule" {
				rules = append(rules, d)
			}
		}
		if len(rules) > 1 {
			t.Fatalf("%d PrometheusRules rendered", len(rules))
		}
		if len(rules) == 0 {
			return nil
		}
		return rules[0].obj
	}
	if got := rule(nil); got != nil {
		t.Fatalf("the default values render a PrometheusRule: %v", got)
	}
	for _, c := range []struct {
		name            string
		ruleVals        map[string]any
		namespace, pick string // pick: the selector label's value
	}{
		{"defaults", map[string]any{"enabled": true}, installNamespace, "prometheus"},
		{"namespace and labels", map[string]any{"enabled": true, "namespace": "monitoring", "labels": map[string]any{"release": "kube-prom"}},
			"monitoring", "kube-prom"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := rule(map[string]any{"metrics": map[string]any{"prometheusRule": c.ruleVals}})
			if got == nil {
				t.Fatal("no PrometheusRule rendered")
			}
			for _, at := range [][]string{{"apiVersion"}, {"kind"}, {"metadata", "name"}, {"spec"}} {
				if g, w := lookup(got, at), lookup(file, at); !reflect.DeepEqual(g, w) {
					t.Errorf("%v differs from %s:\n%s", at, rulesFile, diff.Diff(w, g))
				}
			}
			if ns := lookup(got, []string{"metadata", "namespace"}); ns != c.namespace {
				t.Errorf("namespace %v, want %s", ns, c.namespace)
			}
			for k, want := range map[string]any{"release": c.pick, "app.kubernetes.io/part-of": "gitea-dynamic-runner", "app.kubernetes.io/managed-by": "Helm"} {
				if v := lookup(got, []string{"metadata", "labels", k}); v != want {
					t.Errorf("label %s = %v, want %v", k, v, want)
				}
			}
		})
	}
}

// TestHelmRendersWhatRecoverStatusUses: deploy/keda/manual/recover-status.yaml runs on a Helm
// install as it is (docs/OPERATIONS.md, "Metrics"): the chart renders the ServiceAccount and
// the ConfigMaps it names.
func TestHelmRendersWhatRecoverStatusUses(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("keda", "manual", "recover-status.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var job map[string]any
	if err := yaml.Unmarshal(data, &job); err != nil {
		t.Fatal(err)
	}
	pod := []string{"spec", "template", "spec"}
	want := []string{"ServiceAccount " + lookup(job, append(pod, "serviceAccountName")).(string),
		"ConfigMap " + lookup(job, append(pod, "containers", "recover", "envFrom", "0", "configMapRef", "name")).(string),
		"ConfigMap " + lookup(job, append(pod, "volumes", "pools", "configMap", "name")).(string)}
	chart := byKey(mustRenderChart(t, installNamespace, nil))
	for _, key := range want {
		if _, ok := chart[key]; !ok {
			t.Errorf("recover-status.yaml uses %s, which the chart does not render", key)
		}
	}
}

// TestHelmExecutorsEgress checks, on the network model of TestNetworkPolicies, the chart's two
// knobs of the executors' egress, with the executor Pod the pod backend makes from the rendered
// config: executors.egress.internet (on by default; off, executors reach the gateway and DNS
// alone) and executors.egress.gitea (off by default; on, an in-cluster Gitea's Pods, selected by
// namespace and labels, on its port alone).
func TestHelmExecutorsEgress(t *testing.T) {
	internet := endpoint{name: "the internet (github.com)", ip: netip.MustParseAddr("140.82.112.3")}
	wireServer := endpoint{name: "Azure's WireServer", ip: netip.MustParseAddr("168.63.129.16")}
	forge := endpoint{name: "Gitea in forge", namespace: "forge", labels: map[string]string{"app": "forge"}, ip: netip.MustParseAddr("10.244.3.7")}
	forgeOther := endpoint{name: "another Pod in forge", namespace: "forge", labels: map[string]string{"app": "db"}, ip: netip.MustParseAddr("10.244.3.8")}
	gitea := endpoint{name: "Gitea in gitea", namespace: "gitea", labels: map[string]string{"app.kubernetes.io/name": "gitea"}, ip: netip.MustParseAddr("10.244.3.9")}
	dns := endpoint{name: "kube-dns", namespace: "kube-system", labels: map[string]string{"k8s-app": "kube-dns"}, ip: netip.MustParseAddr("10.244.0.3")}
	type conn struct {
		dst  endpoint
		port int32
		want bool
	}
	onGitea := map[string]any{"enabled": true, "namespace": "forge", "podLabels": map[string]any{"app": "forge"}, "port": 3000}
	for _, tc := range []struct {
		name  string
		vals  map[string]any
		conns []conn
	}{
		{"defaults", nil, []conn{{internet, 443, true}, {wireServer, 80, false}, {gitea, 3000, false}, {forge, 3000, false}}},
		{"internet off", map[string]any{"executors": map[string]any{"egress": map[string]any{"internet": false}}},
			[]conn{{internet, 443, false}, {dns, 53, true}, {gitea, 3000, false}}},
		{"in-cluster Gitea", map[string]any{"executors": map[string]any{"egress": map[string]any{"gitea": onGitea}}},
			[]conn{{forge, 3000, true}, {forge, 22, false}, {forgeOther, 3000, false}, {gitea, 3000, false}, {internet, 443, true}}},
		{"in-cluster Gitea alone", map[string]any{"executors": map[string]any{"egress": map[string]any{"internet": false, "gitea": onGitea}}},
			[]conn{{forge, 3000, true}, {internet, 443, false}, {wireServer, 80, false}}},
		{"in-cluster Gitea by the default labels", map[string]any{"executors": map[string]any{"egress": map[string]any{"gitea": map[string]any{"enabled": true}}}},
			[]conn{{gitea, 3000, true}, {gitea, 22, false}, {forge, 3000, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs := mustRenderChart(t, installNamespace, tc.vals)
			ps := loadPolicies(t, docs)
			p := executorPod(t, docs)
			executor := endpoint{name: "executor " + p.Name, namespace: p.Namespace, labels: p.Labels, ip: netip.MustParseAddr("10.244.1.10")}
			gateway := endpoint{name: "gateway", namespace: installNamespace, labels: map[string]string{"app.kubernetes.io/name": "gateway"},
				ip: netip.MustParseAddr("10.244.1.20")}
			for _, c := range append(tc.conns, conn{gateway, 8443, true}) {
				proto := corev1.ProtocolTCP
				if c.port == 53 {
					proto = corev1.ProtocolUDP
				}
				if got := ps.allowed(t, executor, c.dst, c.port, proto); got != c.want {
					t.Errorf("executor to %s on %d: allowed %v, want %v", c.dst.name, c.port, got, c.want)
				}
			}
		})
	}
}

// TestHelmPodPlacement renders the chart on both scalers with every placement value set, each
// function's different, and checks every Pod template of the release: its function's resources
// (but handle's setup Job, whose are its own), priority class, node selector, tolerations,
// affinity and annotations (Knative's own kept beside them), and the release's pull secrets;
// and with the defaults, none of them but the resources.
func TestHelmPodPlacement(t *testing.T) {
	cpu := map[string]string{"dispatch": "110m", "handle": "120m", "recover": "130m", "gateway": "140m"}
	functions := slices.Sorted(maps.Keys(cpu))
	placement := func(fn string) map[string]any {
		return map[string]any{
			"resources":         map[string]any{"requests": map[string]any{"cpu": cpu[fn], "memory": "1Gi"}, "limits": map[string]any{"memory": "2Gi"}},
			"nodeSelector":      map[string]any{"pool": fn},
			"tolerations":       []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": fn, "effect": "NoSchedule"}},
			"affinity":          map[string]any{"podAntiAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{"weight": 1, "podAffinityTerm": map[string]any{"topologyKey": "kubernetes.io/hostname", "labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": fn}}}}}}},
			"podAnnotations":    map[string]any{"example.com/function": fn},
			"priorityClassName": "gdr-" + fn,
		}
	}
	for _, scaler := range []string{"keda", "knative"} {
		t.Run(scaler, func(t *testing.T) {
			vals := map[string]any{"scaler": scaler, "knative": map[string]any{"tickToken": "t"},
				"imagePullSecrets": []any{map[string]any{"name": "regcred"}}}
			for _, fn := range functions {
				vals[fn] = placement(fn)
			}
			seen := map[string]int{}
			for _, p := range podTemplates(t, mustRenderChart(t, installNamespace, vals)) {
				if p.pool != "" {
					continue
				}
				fn := p.labels["app.kubernetes.io/name"]
				if fn == "keys" { // the keys Job is placed as handle, with resources of its own
					fn = "handle"
				}
				want := placement(fn)
				seen[fn]++
				s := p.spec
				if s.PriorityClassName != "gdr-"+fn || s.NodeSelector["pool"] != fn || len(s.Tolerations) != 1 || s.Tolerations[0].Value != fn ||
					s.Affinity == nil || s.Affinity.PodAntiAffinity == nil ||
					len(s.ImagePullSecrets) != 1 || s.ImagePullSecrets[0].Name != "regcred" {
					t.Errorf("%s (%s): placement %q %v %+v %+v %+v", p, fn, s.PriorityClassName, s.NodeSelector, s.Tolerations, s.Affinity, s.ImagePullSecrets)
				}
				ann := stringMap(path(p.doc.obj, append(strings.Split(p.path, "."), "metadata", "annotations")...))
				if ann["example.com/function"] != fn || (p.knative && ann["autoscaling.knative.dev/min-scale"] != "0") {
					t.Errorf("%s: annotations %v", p, ann)
				}
				res := s.Containers[0].Resources
				switch {
				case p.doc.name() == "handle-setup":
					want = map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "50m"}}}
				case p.labels["app.kubernetes.io/name"] == "keys":
					want = map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "10m"}}}
				}
				wantCPU := path(want, "resources", "requests", "cpu")
				if got := res.Requests.Cpu().String(); got != wantCPU {
					t.Errorf("%s: cpu request %s, want %v", p, got, wantCPU)
				}
			}
			for _, fn := range functions {
				if seen[fn] == 0 {
					t.Errorf("no Pod template of %s rendered", fn)
				}
			}
		})
	}
	for _, p := range podTemplates(t, mustRenderChart(t, installNamespace, nil)) {
		s := p.spec
		if p.pool != "" {
			continue
		}
		if s.PriorityClassName != "" || s.NodeSelector != nil || s.Tolerations != nil || s.Affinity != nil || s.ImagePullSecrets != nil {
			t.Errorf("%s: the defaults place it: %+v", p, s)
		}
		if got := s.Containers[0].Resources.Requests.Memory().String(); got != "64Mi" {
			t.Errorf("%s: the default memory request %s, want 64Mi", p, got)
		}
	}
}

// TestHelmChartHasNoSymlink: a chart packaged or pulled elsewhere holds only its own files
// (Helm follows a symlink out of the chart when it loads a folder, not when it packages one
// someone else unpacks); the Prometheus rules live in the chart, and deploy/prometheus links
// to them.
func TestHelmChartHasNoSymlink(t *testing.T) {
	err := filepath.WalkDir(chartDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&os.ModeSymlink != 0 {
			t.Errorf("%s is a symlink", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// renderRelease renders the chart as `helm template` does (Helm's own install action, client
// only: the values schema checked, nothing sent anywhere) into namespace ns with vals, and
// returns the release: its manifest, hooks and notes.
func renderRelease(t testing.TB, ns string, vals map[string]any) (release.Accessor, error) {
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
	return acc, nil
}

// TestHelmTestHook: the chart's one hook is helm test's Pod, running `dispatch check` as
// dispatch with nothing of gdr-secrets (no key), hardened as every Pod of the release and
// placed as dispatch; the notes name the namespaces, the check and every pool's labels.
func TestHelmTestHook(t *testing.T) {
	acc, err := renderRelease(t, installNamespace, map[string]any{"dispatch": map[string]any{"nodeSelector": map[string]any{"pool": "control"}}})
	if err != nil {
		t.Fatal(err)
	}
	hooks := acc.Hooks()
	if len(hooks) != 1 {
		t.Fatalf("%d hooks, want helm test's one", len(hooks))
	}
	h, err := release.NewHookAccessor(hooks[0])
	if err != nil {
		t.Fatal(err)
	}
	var docs []doc
	raws, err := splitDocs([]byte(h.Manifest()))
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range raws {
		var obj map[string]any
		if err := yaml.Unmarshal(raw, &obj); err != nil {
			t.Fatal(err)
		}
		docs = append(docs, doc{file: "helm-test", raw: raw, obj: obj})
	}
	if len(docs) != 1 || docs[0].kind() != "Pod" || path(docs[0].obj, "metadata", "annotations", "helm.sh/hook") != "test" {
		t.Fatalf("the hook: %s", h.Manifest())
	}
	var pod corev1.Pod
	if err := strictValue(docs[0].obj, &pod); err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if !slices.Equal(c.Command, []string{"dispatch"}) || !slices.Equal(c.Args, []string{"check"}) || pod.Spec.ServiceAccountName != "gitea-dynamic-runner-dispatch" ||
		pod.Spec.NodeSelector["pool"] != "control" {
		t.Errorf("the check Pod: %+v", pod.Spec)
	}
	if strings.Contains(string(docs[0].raw), "gdr-secrets") {
		t.Errorf("the check Pod reads gdr-secrets:\n%s", docs[0].raw)
	}
	if problems := hardeningProblems(podTemplate{doc: docs[0], path: "spec", spec: pod.Spec, labels: pod.Labels}); len(problems) > 0 {
		t.Errorf("the check Pod is not hardened: %v", problems)
	}
	notes := acc.Notes()
	for _, want := range []string{"release gdr in " + installNamespace, "executors run in gitea-dynamic-runner-jobs", "helm test gdr -n " + installNamespace + " --logs",
		"logs gdr-check", "linux (pod, capacity 10): ubuntu-latest"} {
		if !strings.Contains(notes, want) {
			t.Errorf("the notes lack %q:\n%s", want, notes)
		}
	}
}

// TestHelmIdentityCA renders identity ca: no SPIRE setting and no Workload API in any Pod of
// the release; the CA's Secret mounted by handle's Pods alone (the minter), the gateway's
// certificate and the bundle by the gateway; the keys Job told to keep the CA and a CronJob
// renewing the gateway's certificate; and the combinations it cannot serve refused by name.
func TestHelmIdentityCA(t *testing.T) {
	docs := mustRenderChart(t, installNamespace, map[string]any{"identity": "ca"})
	k := byKey(docs)
	cfg := stringMap(path(k["ConfigMap gdr-config"].obj, "data"))
	if cfg["GDR_POD_IDENTITY"] != "ca" || cfg["GDR_CA_DIR"] == "" || cfg["GDR_SPIRE_SERVER"] != "" || cfg["GDR_CLUSTER_NAME"] != "" {
		t.Errorf("gdr-config: %v", cfg)
	}
	caMounters := map[string]bool{}
	for _, p := range podTemplates(t, docs) {
		if p.pool != "" {
			continue
		}
		for _, v := range p.spec.Volumes {
			if v.Name == "spiffe-workload-api" || v.CSI != nil || v.HostPath != nil {
				t.Errorf("%s mounts the Workload API: %+v", p, v)
			}
			if v.Projected == nil {
				continue
			}
			for _, src := range v.Projected.Sources {
				if src.Secret != nil && src.Secret.Name == "gdr-identity-ca" {
					caMounters[p.doc.kind()+" "+p.doc.name()] = true
				}
			}
		}
		for _, c := range p.spec.Containers {
			for _, e := range c.Env {
				if e.Name == "SPIFFE_ENDPOINT_SOCKET" {
					t.Errorf("%s: %s names a Workload API socket", p, c.Name)
				}
			}
		}
	}
	if want := map[string]bool{"ScaledJob handle-pod": true}; !maps.Equal(caMounters, want) {
		t.Errorf("the CA is mounted by %v, want handle's Pods alone", caMounters)
	}
	gw := byKey(docs)["Deployment gateway"].obj
	env := fmt.Sprint(path(gw, "spec", "template", "spec", "containers"))
	for _, want := range []string{"GDR_SVID_CERT", "/var/run/secrets/gitea-dynamic-runner/svid/tls.crt", "gdr-gateway-svid", "gdr-identity-bundle"} {
		if !strings.Contains(env+fmt.Sprint(path(gw, "spec", "template", "spec", "volumes")), want) {
			t.Errorf("the gateway lacks %q", want)
		}
	}
	if _, ok := k["CronJob keys-renew"]; !ok {
		t.Error("no keys-renew CronJob")
	}
	if !strings.Contains(string(k["Job keys-1"].raw), "GDR_KEYS_CA\n              value: \"true\"") {
		t.Errorf("the keys Job is not told to keep the CA:\n%s", k["Job keys-1"].raw)
	}
	withToken := byKey(mustRenderChart(t, installNamespace, map[string]any{"gitea": map[string]any{"registrationTokenSecret": "gdr-registration-token"}}))
	for _, want := range []string{"name: GDR_KEYS_REGISTER", "name: gdr-registration-token"} {
		if !strings.Contains(string(withToken["Job keys-1"].raw), want) {
			t.Errorf("with gitea.registrationTokenSecret, the keys Job lacks %q:\n%s", want, withToken["Job keys-1"].raw)
		}
	}
	if strings.Contains(string(k["Job keys-1"].raw), "GDR_KEYS_REGISTER") {
		t.Error("the keys Job registers without a token Secret")
	}
	if _, ok := byKey(mustRenderChart(t, installNamespace, map[string]any{"identity": "ca", "spire": map[string]any{"podIdentity": "workload-api"}}))["ClusterRole gitea-dynamic-runner-nodes"]; ok {
		t.Error("identity ca with spire.podIdentity workload-api grants the Nodes ClusterRole")
	}
	spireDocs := byKey(mustRenderChart(t, installNamespace, nil))
	if _, ok := spireDocs["CronJob keys-renew"]; ok {
		t.Error("a keys-renew CronJob with identity spire")
	}
	for _, tc := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"identity": "ca", "scaler": "knative", "knative": map[string]any{"tickToken": "t"}}, "identity: ca is for scaler keda"},
		{map[string]any{"identity": "ca", "keys": map[string]any{"generate": false}}, "identity: ca needs keys.generate: true"},
		{map[string]any{"identity": "agent"}, "identity"},
	} {
		if _, err := renderChart(t, installNamespace, tc.vals); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.vals, err, tc.want)
		}
	}
}

// TestHelmMetricsPushURL: metrics.pushURL is GDR_METRICS_PUSH_URL in gdr-config, which handle's
// Jobs and recover's CronJob read (envFrom); unset by default, as kustomize's base leaves it.
func TestHelmMetricsPushURL(t *testing.T) {
	config := func(vals map[string]any) map[string]any {
		t.Helper()
		for _, d := range mustRenderChart(t, installNamespace, vals) {
			if d.kind() == "ConfigMap" && path(d.obj, "metadata", "name") == "gdr-config" {
				return path(d.obj, "data").(map[string]any)
			}
		}
		t.Fatal("no ConfigMap gdr-config")
		return nil
	}
	if v, ok := config(nil)["GDR_METRICS_PUSH_URL"]; ok {
		t.Errorf("the default values set GDR_METRICS_PUSH_URL %v", v)
	}
	const url = "http://prometheus-pushgateway.monitoring.svc:9091"
	if v := config(map[string]any{"metrics": map[string]any{"pushURL": url}})["GDR_METRICS_PUSH_URL"]; v != url {
		t.Errorf("GDR_METRICS_PUSH_URL = %v, want %s", v, url)
	}
}

// TestHelmPodMonitor: off by default; enabled, it selects the release's dispatch and gateway
// Pods, and each endpoint's port is a named port of one of them (both are scraped) whose
// targets are labelled component with the Pod's app.kubernetes.io/name (the absent alerts
// select up by it), in the release's namespace unless told otherwise, with the labels the
// operator selects on.
func TestHelmPodMonitor(t *testing.T) {
	for _, d := range mustRenderChart(t, installNamespace, nil) {
		if d.kind() == "PodMonitor" {
			t.Fatal("the default values render a PodMonitor")
		}
	}
	docs := mustRenderChart(t, installNamespace, map[string]any{"metrics": map[string]any{"podMonitor": map[string]any{"enabled": true, "labels": map[string]any{"team": "ci"}}}})
	monitors := slices.DeleteFunc(slices.Clone(docs), func(d doc) bool { return d.kind() != "PodMonitor" })
	if len(monitors) != 1 {
		t.Fatalf("%d PodMonitors", len(monitors))
	}
	m := monitors[0].obj
	if path(m, "metadata", "namespace") != installNamespace || path(m, "metadata", "labels", "team") != "ci" {
		t.Errorf("PodMonitor metadata %v", path(m, "metadata"))
	}
	ports := map[string]string{} // port name -> function
	for _, p := range podTemplates(t, docs) {
		fn := p.labels["app.kubernetes.io/name"]
		if fn != "dispatch" && fn != "gateway" {
			continue
		}
		for _, c := range p.spec.Containers {
			for _, port := range c.Ports {
				ports[port.Name] = fn
			}
		}
	}
	scraped := map[string]bool{}
	for _, e := range path(m, "spec", "podMetricsEndpoints").([]any) {
		name := e.(map[string]any)["port"].(string)
		fn, ok := ports[name]
		if !ok {
			t.Errorf("endpoint port %q is no port of dispatch or the gateway (%v)", name, ports)
		}
		scraped[fn] = true
		// GDRDispatchAbsent and GDRGatewayAbsent select up{component="dispatch"} and
		// up{component="gateway"}.
		relabel, _ := e.(map[string]any)["relabelings"].([]any)
		if !slices.ContainsFunc(relabel, func(r any) bool {
			r1 := r.(map[string]any)
			return r1["targetLabel"] == "component" && reflect.DeepEqual(r1["sourceLabels"], []any{"__meta_kubernetes_pod_label_app_kubernetes_io_name"})
		}) {
			t.Errorf("endpoint port %q does not label its targets' component with the Pod's app.kubernetes.io/name: %v", name, relabel)
		}
	}
	if !scraped["dispatch"] || !scraped["gateway"] {
		t.Errorf("scraped %v, want dispatch and the gateway", scraped)
	}
}
