//go:build e2e

package deploy

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// tickToken stands in for the tick token envsubst fills in (deploy/README.md).
const tickToken = "e2e-tick-token"

// TestE2EKustomizeDryRun builds keda and knative with kustomize, with both namespaces and the
// images overridden in kustomization.yaml, and server-side applies every object in dry-run mode
// to a real API server with the KEDA, Knative and eventing-natss CRDs installed: the API server
// validates each one (built-in types, CRD schemas, RBAC) as kubectl apply -k would send it.
func TestE2EKustomizeDryRun(t *testing.T) {
	p := plane.Plane(t)
	if _, err := envtest.InstallCRDs(p.RESTConfig(), envtest.CRDInstallOptions{
		Paths: []string{filepath.Join("testdata", "crds")}, ErrorIfPathMissing: true,
	}); err != nil {
		t.Fatalf("install the CRDs of testdata/crds: %v", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(p.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(p.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			ns, jobs := p.Namespace(t), p.Namespace(t)
			root := copyDeploy(t)
			override(t, filepath.Join(root, dir), ns, "registry.example.net/gdr", "v1.2.3")
			setExecutorsNamespace(t, filepath.Join(root, dir), jobs)
			docs := buildKustomization(t, filepath.Join(root, dir))
			if probs := namespaceProblems(docs, ns, jobs); len(probs) > 0 {
				t.Fatalf("namespaces %s and %s:\n%s", ns, jobs, strings.Join(probs, "\n"))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for _, d := range docs {
				raw := strings.ReplaceAll(string(d.raw), "${GDR_TICK_TOKEN}", tickToken) // the envsubst step
				var obj unstructured.Unstructured
				if err := yaml.Unmarshal([]byte(raw), &obj.Object); err != nil {
					t.Fatalf("%s: %v", d, err)
				}
				gvk := obj.GroupVersionKind()
				m, err := mapper.RESTMapping(schema.GroupKind{Group: gvk.Group, Kind: gvk.Kind}, gvk.Version)
				if err != nil {
					t.Errorf("%s: no API for %s: %v", d, gvk, err)
					continue
				}
				var res dynamic.ResourceInterface = dyn.Resource(m.Resource)
				if m.Scope.Name() == "namespace" {
					res = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
				}
				_, err = res.Apply(ctx, obj.GetName(), &obj, metav1.ApplyOptions{
					FieldManager: "gdr-e2e", Force: true, DryRun: []string{metav1.DryRunAll},
				})
				if err != nil {
					t.Errorf("%s: server-side apply (dry run): %v", d, err)
				}
			}
		})
	}
}
