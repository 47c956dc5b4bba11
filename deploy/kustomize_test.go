package deploy

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// kustomizations are the install paths: each folder is a kustomization (kubectl apply -k) that
// includes base.
var kustomizations = []string{"keda", "knative"}

// functionImages are the images of the functions, as the manifests name them; each
// kustomization's images: overrides them.
var functionImages = map[string]string{
	"handle":   "ghcr.io/example/gitea-dynamic-runner-handle",
	"recover":  "ghcr.io/example/gitea-dynamic-runner-recover",
	"dispatch": "ghcr.io/example/gitea-dynamic-runner-dispatch",
	"gateway":  "ghcr.io/example/gitea-dynamic-runner-gateway",
}

// clusterScoped are the kinds of the manifests without a namespace.
var clusterScoped = map[string]bool{"ClusterRole": true, "ClusterRoleBinding": true}

// buildKustomization runs kustomize (its Go API, as kubectl kustomize does) on the folder dir and
// returns the documents it outputs.
func buildKustomization(t testing.TB, dir string) []doc {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var docs []doc
	for _, r := range m.Resources() {
		raw, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(raw, &obj); err != nil {
			t.Fatal(err)
		}
		docs = append(docs, doc{file: dir + "/" + r.CurId().String(), raw: raw, obj: obj})
	}
	return docs
}

// copyDeploy copies the manifest folders into a temporary folder and returns it, so that a test
// can change a kustomization.yaml.
func copyDeploy(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	for _, dir := range append(slices.Clone(manifestDirs), "components", "executors") {
		err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() {
				return os.MkdirAll(filepath.Join(root, path), 0o700)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(root, path), data, 0o600)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// readKustomization decodes dir/kustomization.yaml strictly.
func readKustomization(t testing.TB, dir string) types.Kustomization {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k types.Kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	return k
}

// override sets, in dir/kustomization.yaml, the namespace and, unless registry is "", every
// function image (name, tag), as an installer would: the one place both are set.
func override(t testing.TB, dir, namespace, registry, tag string) {
	t.Helper()
	k := readKustomization(t, dir)
	k.Namespace = namespace
	for i := range k.Images {
		if registry == "" {
			break
		}
		k.Images[i].NewName = registry + "/" + filepath.Base(k.Images[i].Name)
		k.Images[i].NewTag = tag
	}
	data, err := yaml.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// setExecutorsNamespace sets, in dir/kustomization.yaml, the executors' namespace as an
// installer does: GDR_KUBE_NAMESPACE merged into gdr-config, the one place it is set.
func setExecutorsNamespace(t testing.TB, dir, ns string) {
	t.Helper()
	k := readKustomization(t, dir)
	k.ConfigMapGenerator = append(k.ConfigMapGenerator, types.ConfigMapArgs{GeneratorArgs: types.GeneratorArgs{
		Name: "gdr-config", Behavior: "merge", KvPairSources: types.KvPairSources{LiteralSources: []string{"GDR_KUBE_NAMESPACE=" + ns}},
	}})
	k.GeneratorOptions = &types.GeneratorOptions{DisableNameSuffixHash: true}
	data, err := yaml.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// containerImages returns the image of every container and init container in obj, wherever it
// is (Deployment, CronJob, ScaledJob, Knative Service, ...).
func containerImages(obj map[string]any) []string {
	var out []string
	walk(obj, func(m map[string]any) {
		for _, key := range []string{"containers", "initContainers"} {
			list, _ := m[key].([]any)
			for _, c := range list {
				if c, ok := c.(map[string]any); ok {
					img, _ := c["image"].(string)
					out = append(out, img)
				}
			}
		}
	})
	return out
}

// inExecutorsNamespace tells whether an object of the install belongs in the executors'
// namespace: every Role and RoleBinding (handle's and recover's, on the executors' Pods,
// Secrets and Events; the control plane's namespace grants nothing), the executors' network
// policies and their disruption budget.
func inExecutorsNamespace(d doc) bool {
	switch d.kind() {
	case "Role", "RoleBinding":
		return true
	case "NetworkPolicy", "PodDisruptionBudget":
		return strings.HasPrefix(d.name(), "gdr-executors")
	}
	return false
}

// namespaceProblems returns every place of a built install where a namespace is not as it must
// be with the control plane in ns and the executors in jobs: metadata.namespace of namespaced
// objects (inExecutorsNamespace: jobs, else ns), none on cluster-scoped ones; the ServiceAccount
// subjects of the RBAC bindings (ns); gdr-config's GDR_KUBE_NAMESPACE (jobs) and the gateway's
// address when it is a Service name (gateway.<ns>.svc); and the network policies' peers
// selecting the gateway (namespace ns) or executors (namespace jobs).
func namespaceProblems(docs []doc, ns, jobs string) []string {
	var probs []string
	for _, d := range docs {
		want := ns
		if inExecutorsNamespace(d) {
			want = jobs
		}
		got, _ := path(d.obj, "metadata", "namespace").(string)
		switch {
		case clusterScoped[d.kind()] && got != "":
			probs = append(probs, fmt.Sprintf("%s: cluster-scoped, but namespace %q", d, got))
		case !clusterScoped[d.kind()] && got != want:
			probs = append(probs, fmt.Sprintf("%s: namespace %q, want %q", d, got, want))
		}
		switch d.kind() {
		case "RoleBinding", "ClusterRoleBinding":
			subjects, _ := d.obj["subjects"].([]any)
			for _, s := range subjects {
				s, _ := s.(map[string]any)
				if s["kind"] == "ServiceAccount" && s["namespace"] != ns {
					probs = append(probs, fmt.Sprintf("%s: subject ServiceAccount %v in namespace %v, want %q", d, s["name"], s["namespace"], ns))
				}
			}
		case "ConfigMap":
			if d.name() != "gdr-config" {
				continue
			}
			data := stringMap(d.obj["data"])
			if data["GDR_KUBE_NAMESPACE"] != jobs {
				probs = append(probs, fmt.Sprintf("%s: GDR_KUBE_NAMESPACE %q, want %q", d, data["GDR_KUBE_NAMESPACE"], jobs))
			}
			if u := data["GDR_GATEWAY_URL"]; strings.Contains(u, ".svc") && !strings.HasPrefix(u, "https://gateway."+ns+".svc:") {
				probs = append(probs, fmt.Sprintf("%s: GDR_GATEWAY_URL %q, want the gateway Service of %q", d, u, ns))
			}
		case "NetworkPolicy":
			probs = append(probs, peerNamespaceProblems(d, ns, jobs)...)
		}
	}
	return probs
}

// peerNamespaceProblems checks a NetworkPolicy's peers: one selecting the gateway's Pods must
// name the namespace ns, one selecting executors (the runner label) the namespace jobs, and
// neither may leave the namespace out when the policy is in the other one.
func peerNamespaceProblems(d doc, ns, jobs string) []string {
	var probs []string
	policyNS, _ := path(d.obj, "metadata", "namespace").(string)
	for _, dir := range []string{"ingress", "egress"} {
		rules, _ := path(d.obj, "spec", dir).([]any)
		for i, r := range rules {
			peers, _ := path(r.(map[string]any), map[string]string{"ingress": "from", "egress": "to"}[dir]).([]any)
			for _, p := range peers {
				p, _ := p.(map[string]any)
				pods := stringMap(path(p, "podSelector", "matchLabels"))
				want := ""
				switch {
				case pods["app.kubernetes.io/name"] == "gateway":
					want = ns
				case pods["gitea-dynamic-runner.io/runner"] == "true":
					want = jobs
				default:
					continue
				}
				got, named := path(p, "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name").(string)
				if !named {
					got = policyNS // a podSelector alone selects in the policy's namespace
				}
				if got != want {
					probs = append(probs, fmt.Sprintf("%s: %s[%d] selects %v in namespace %q, want %q", d, dir, i, pods, got, want))
				}
			}
		}
	}
	return probs
}

// objectKeys returns "Kind name" of every document, sorted.
func objectKeys(docs []doc) []string {
	var out []string
	for _, d := range docs {
		out = append(out, d.kind()+" "+d.name())
	}
	sort.Strings(out)
	return out
}

// TestKustomizations builds keda and knative with kustomize's Go API: as shipped (the control
// plane in gitea-dynamic-runner, the executors' objects in gitea-dynamic-runner-jobs, every file
// of the folder and of base included), with the namespace and the images changed in
// kustomization.yaml alone, which must land on every object, every RBAC subject and every
// container, and then with GDR_KUBE_NAMESPACE changed too, which must move the executors'
// objects and every reference to either namespace (namespaceProblems).
func TestKustomizations(t *testing.T) {
	docs := loadManifests(t)
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			shipped := buildKustomization(t, dir)
			// Every manifest of the folder (manual/ is applied by hand) and of base is listed:
			// a new file must be added to resources.
			var want []doc
			for _, d := range installed(docs, dir) {
				if !strings.HasPrefix(filepath.ToSlash(d.file), dir+"/manual/") {
					want = append(want, d)
				}
			}
			if got, want := objectKeys(shipped), objectKeys(want); !slices.Equal(got, want) {
				t.Errorf("kustomize build %s outputs\n  %v\nthe folder and base hold\n  %v\n(a file missing from kustomization.yaml resources?)", dir, got, want)
			}
			if probs := namespaceProblems(shipped, installNamespace, jobsNamespace); len(probs) > 0 {
				t.Errorf("as shipped:\n%s", strings.Join(probs, "\n"))
			}
			images := map[string]bool{}
			for _, d := range shipped {
				for _, img := range containerImages(d.obj) {
					images[img] = true
				}
			}
			k := readKustomization(t, dir)
			var named []string
			for _, img := range k.Images {
				named = append(named, img.Name)
			}
			for fn, img := range functionImages {
				if !slices.Contains(named, img) {
					t.Errorf("kustomization.yaml images: no entry for %s (%s)", img, fn)
				}
			}

			const (
				ns       = "ci-elsewhere"
				registry = "registry.example.net/gdr"
				tag      = "v9.8.7"
			)
			root := copyDeploy(t)
			override(t, filepath.Join(root, dir), ns, registry, tag)
			built := buildKustomization(t, filepath.Join(root, dir))
			if probs := namespaceProblems(built, ns, jobsNamespace); len(probs) > 0 {
				t.Errorf("namespace %s set in kustomization.yaml:\n%s", ns, strings.Join(probs, "\n"))
			}
			setExecutorsNamespace(t, filepath.Join(root, dir), ns+"-executors")
			if probs := namespaceProblems(buildKustomization(t, filepath.Join(root, dir)), ns, ns+"-executors"); len(probs) > 0 {
				t.Errorf("GDR_KUBE_NAMESPACE %s-executors set in kustomization.yaml:\n%s", ns, strings.Join(probs, "\n"))
			}
			used := map[string]int{}
			for _, d := range built {
				for _, img := range containerImages(d.obj) {
					fn, ok := strings.CutPrefix(img, registry+"/gitea-dynamic-runner-")
					fn, found := strings.CutSuffix(fn, ":"+tag)
					if !ok || !found || functionImages[fn] == "" {
						t.Errorf("%s: container image %q, want %s/gitea-dynamic-runner-<function>:%s", d, img, registry, tag)
						continue
					}
					used[fn]++
				}
			}
			for fn := range functionImages {
				if used[fn] == 0 {
					t.Errorf("no container runs the %s image after the override", fn)
				}
			}
		})
	}
}

// TestOverlayNamespaces builds the overlay deploy/REFERENCE.md ("Namespaces") shows for other
// namespaces: `namespace:` of its own, GDR_KUBE_NAMESPACE merged into gdr-config and the
// executors transformer run again. Without the transformer the overlay's namespace would take
// the executors' objects along, which the check must see.
func TestOverlayNamespaces(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			root := copyDeploy(t)
			overlay := filepath.Join(root, "my-deploy")
			if err := os.Mkdir(overlay, 0o700); err != nil {
				t.Fatal(err)
			}
			write := func(transformers string) []doc {
				t.Helper()
				k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: ci\nresources: [../" + dir + "]\n" +
					"configMapGenerator:\n  - {name: gdr-config, behavior: merge, literals: [GDR_KUBE_NAMESPACE=ci-jobs]}\n" +
					"generatorOptions: {disableNameSuffixHash: true}\n" + transformers
				if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o600); err != nil {
					t.Fatal(err)
				}
				return buildKustomization(t, overlay)
			}
			if probs := namespaceProblems(write("transformers: [../executors]\n"), "ci", "ci-jobs"); len(probs) > 0 {
				t.Errorf("the overlay:\n%s", strings.Join(probs, "\n"))
			}
			if probs := namespaceProblems(write(""), "ci", "ci-jobs"); len(probs) == 0 {
				t.Error("the overlay without the executors transformer passes the namespace check")
			}
		})
	}
}

// TestNamespaceCheckBites feeds namespaceProblems what kustomize would leave behind if it did
// not rewrite a binding's subjects, an object's namespace or a reference to either namespace.
func TestNamespaceCheckBites(t *testing.T) {
	parse := func(s string) doc {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(s), &obj); err != nil {
			t.Fatal(err)
		}
		return doc{file: "test", obj: obj}
	}
	for _, tc := range []struct {
		name, yaml string
		bad        bool
	}{
		{"binding subject in place", `{kind: RoleBinding, metadata: {name: b, namespace: j}, subjects: [{kind: ServiceAccount, name: s, namespace: x}]}`, false},
		{"binding subject elsewhere", `{kind: RoleBinding, metadata: {name: b, namespace: j}, subjects: [{kind: ServiceAccount, name: s, namespace: gitea-dynamic-runner}]}`, true},
		{"binding subject in the executors' namespace", `{kind: RoleBinding, metadata: {name: b, namespace: j}, subjects: [{kind: ServiceAccount, name: s, namespace: j}]}`, true},
		{"binding in the control plane's namespace", `{kind: RoleBinding, metadata: {name: b, namespace: x}, subjects: [{kind: ServiceAccount, name: s, namespace: x}]}`, true},
		{"role in the control plane's namespace", `{kind: Role, metadata: {name: r, namespace: x}}`, true},
		{"cluster binding subject elsewhere", `{kind: ClusterRoleBinding, metadata: {name: b}, subjects: [{kind: ServiceAccount, name: s, namespace: gitea-dynamic-runner}]}`, true},
		{"cluster binding subject in place", `{kind: ClusterRoleBinding, metadata: {name: b}, subjects: [{kind: ServiceAccount, name: s, namespace: x}]}`, false},
		{"object elsewhere", `{kind: ConfigMap, metadata: {name: c, namespace: y}}`, true},
		{"object without namespace", `{kind: ConfigMap, metadata: {name: c}}`, true},
		{"cluster-scoped with a namespace", `{kind: ClusterRole, metadata: {name: c, namespace: x}}`, true},
		{"config in step", `{kind: ConfigMap, metadata: {name: gdr-config, namespace: x}, data: {GDR_KUBE_NAMESPACE: j, GDR_GATEWAY_URL: "https://gateway.x.svc:443"}}`, false},
		{"executors in the control plane's namespace", `{kind: ConfigMap, metadata: {name: gdr-config, namespace: x}, data: {GDR_KUBE_NAMESPACE: x}}`, true},
		{"gateway address in another namespace", `{kind: ConfigMap, metadata: {name: gdr-config, namespace: x}, data: {GDR_KUBE_NAMESPACE: j, GDR_GATEWAY_URL: "https://gateway.y.svc:443"}}`, true},
		{"executor policy in place", `{kind: NetworkPolicy, metadata: {name: gdr-executors, namespace: j}, spec: {egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}, podSelector: {matchLabels: {app.kubernetes.io/name: gateway}}}]}]}}`, false},
		{"executor policy in the control plane's namespace", `{kind: NetworkPolicy, metadata: {name: gdr-executors, namespace: x}}`, true},
		{"executors' way to a gateway of their own namespace", `{kind: NetworkPolicy, metadata: {name: gdr-executors, namespace: j}, spec: {egress: [{to: [{podSelector: {matchLabels: {app.kubernetes.io/name: gateway}}}]}]}}`, true},
		{"gateway admitting executors of its own namespace", `{kind: NetworkPolicy, metadata: {name: gdr-gateway, namespace: x}, spec: {ingress: [{from: [{podSelector: {matchLabels: {gitea-dynamic-runner.io/runner: "true"}}}]}]}}`, true},
		{"gateway admitting executors of theirs", `{kind: NetworkPolicy, metadata: {name: gdr-gateway, namespace: x}, spec: {ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: j}}, podSelector: {matchLabels: {gitea-dynamic-runner.io/runner: "true"}}}]}]}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := len(namespaceProblems([]doc{parse(tc.yaml)}, "x", "j")) > 0; got != tc.bad {
				t.Fatalf("problems found = %v, want %v", got, tc.bad)
			}
		})
	}
}
