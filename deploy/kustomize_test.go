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
	for _, dir := range append(slices.Clone(manifestDirs), "components") {
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

// namespaceProblems returns every place of a built install where the namespace is not ns:
// metadata.namespace of namespaced objects, none on cluster-scoped ones, and the ServiceAccount
// subjects of the RBAC bindings.
func namespaceProblems(docs []doc, ns string) []string {
	var probs []string
	for _, d := range docs {
		got, _ := path(d.obj, "metadata", "namespace").(string)
		switch {
		case clusterScoped[d.kind()] && got != "":
			probs = append(probs, fmt.Sprintf("%s: cluster-scoped, but namespace %q", d, got))
		case !clusterScoped[d.kind()] && got != ns:
			probs = append(probs, fmt.Sprintf("%s: namespace %q, want %q", d, got, ns))
		}
		if d.kind() != "RoleBinding" && d.kind() != "ClusterRoleBinding" {
			continue
		}
		subjects, _ := d.obj["subjects"].([]any)
		for _, s := range subjects {
			s, _ := s.(map[string]any)
			if s["kind"] == "ServiceAccount" && s["namespace"] != ns {
				probs = append(probs, fmt.Sprintf("%s: subject ServiceAccount %v in namespace %v, want %q", d, s["name"], s["namespace"], ns))
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

// TestKustomizations builds keda and knative with kustomize's Go API: as shipped (namespace
// gitea-dynamic-runner, every file of the folder and of base included), and with the namespace
// and the images changed in kustomization.yaml alone, which must land on every object, every
// RBAC subject and every container.
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
			if probs := namespaceProblems(shipped, installNamespace); len(probs) > 0 {
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
			if probs := namespaceProblems(built, ns); len(probs) > 0 {
				t.Errorf("namespace %s set in kustomization.yaml:\n%s", ns, strings.Join(probs, "\n"))
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

// TestNamespaceCheckBites feeds namespaceProblems what kustomize would leave behind if it did
// not rewrite a binding's subjects or an object's namespace.
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
		{"binding subject in place", `{kind: RoleBinding, metadata: {name: b, namespace: x}, subjects: [{kind: ServiceAccount, name: s, namespace: x}]}`, false},
		{"binding subject elsewhere", `{kind: RoleBinding, metadata: {name: b, namespace: x}, subjects: [{kind: ServiceAccount, name: s, namespace: gitea-dynamic-runner}]}`, true},
		{"cluster binding subject elsewhere", `{kind: ClusterRoleBinding, metadata: {name: b}, subjects: [{kind: ServiceAccount, name: s, namespace: gitea-dynamic-runner}]}`, true},
		{"cluster binding subject in place", `{kind: ClusterRoleBinding, metadata: {name: b}, subjects: [{kind: ServiceAccount, name: s, namespace: x}]}`, false},
		{"object elsewhere", `{kind: ConfigMap, metadata: {name: c, namespace: y}}`, true},
		{"object without namespace", `{kind: ConfigMap, metadata: {name: c}}`, true},
		{"cluster-scoped with a namespace", `{kind: ClusterRole, metadata: {name: c, namespace: x}}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := len(namespaceProblems([]doc{parse(tc.yaml)}, "x")) > 0; got != tc.bad {
				t.Fatalf("problems found = %v, want %v", got, tc.bad)
			}
		})
	}
}
