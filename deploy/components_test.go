package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// enableComponent adds the component folder components/<name> to the
// kustomization dir (a copy, see copyDeploy), as an installer would.
func enableComponent(t testing.TB, dir, name string) {
	t.Helper()
	k := readKustomization(t, dir)
	k.Components = append(k.Components, "../components/"+name)
	data, err := yaml.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// The cache component gives every install path's gateway the shared cache
// volume: GDR_CACHE_DIR is the mount of a volume whose claim the component
// creates, ReadWriteMany (the gateway runs more than one replica), in the
// kustomization's namespace.
func TestCacheComponent(t *testing.T) {
	for _, path := range kustomizations {
		t.Run(path, func(t *testing.T) {
			root := copyDeploy(t)
			enableComponent(t, filepath.Join(root, path), "cache")
			var gateway *appsv1.Deployment
			var claim *corev1.PersistentVolumeClaim
			for _, d := range buildKustomization(t, filepath.Join(root, path)) {
				switch {
				case d.kind() == "Deployment" && d.name() == "gateway":
					gateway = &appsv1.Deployment{}
					if err := yaml.UnmarshalStrict(d.raw, gateway); err != nil {
						t.Fatal(err)
					}
				case d.kind() == "PersistentVolumeClaim":
					claim = &corev1.PersistentVolumeClaim{}
					if err := yaml.UnmarshalStrict(d.raw, claim); err != nil {
						t.Fatal(err)
					}
				}
			}
			if gateway == nil || claim == nil {
				t.Fatalf("build lacks the gateway (%v) or the claim (%v)", gateway != nil, claim != nil)
			}
			if claim.Namespace != gateway.Namespace || claim.Namespace == "" {
				t.Errorf("claim in %q, gateway in %q", claim.Namespace, gateway.Namespace)
			}
			if len(claim.Spec.AccessModes) != 1 || claim.Spec.AccessModes[0] != corev1.ReadWriteMany {
				t.Errorf("claim access modes %v, want ReadWriteMany", claim.Spec.AccessModes)
			}
			pod := gateway.Spec.Template.Spec
			var volume string
			for _, v := range pod.Volumes {
				if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim.Name {
					volume = v.Name
				}
			}
			if volume == "" {
				t.Fatalf("no gateway volume uses claim %s", claim.Name)
			}
			for _, c := range pod.Containers {
				if c.Name != "gateway" {
					continue
				}
				var dir, mount string
				for _, e := range c.Env {
					if e.Name == "GDR_CACHE_DIR" {
						dir = e.Value
					}
				}
				for _, m := range c.VolumeMounts {
					if m.Name == volume {
						mount = m.MountPath
					}
				}
				if dir == "" || dir != mount {
					t.Errorf("GDR_CACHE_DIR %q, the claim's mount %q: want the same, not empty", dir, mount)
				}
				if len(c.Env) < 5 || len(c.VolumeMounts) < 5 {
					t.Errorf("the patch replaced the gateway's env or mounts instead of adding to them: %d env, %d mounts", len(c.Env), len(c.VolumeMounts))
				}
				return
			}
			t.Fatal("no gateway container")
		})
	}
}

// Without the workload-api component an installation grants nothing cluster-wide (executors
// get minted SVIDs; no SPIRE entry needs a Node's UID); with it, handle and recover each get
// exactly get on Nodes cluster-wide, and gdr-config switches GDR_POD_IDENTITY, so the grant
// never ships without the mode that uses it (TestE2ERBAC checks each mode's paths use all of
// their grants).
func TestWorkloadAPIComponent(t *testing.T) {
	nodesGet := []string{permission{"", "nodes", "get"}.String()}
	for _, dir := range kustomizations {
		for _, enabled := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/enabled=%v", dir, enabled), func(t *testing.T) {
				root := copyDeploy(t)
				if enabled {
					enableComponent(t, filepath.Join(root, dir), "workload-api")
				}
				docs := buildKustomization(t, filepath.Join(root, dir))
				objs := rbacDocs(t, docs)
				for _, sa := range serviceAccounts {
					_, cluster, problems := objs.granted(installNamespace, sa)
					var want []string
					if enabled && slices.Contains(apiAccess, sa) {
						want = nodesGet
					}
					if got := keysOf(cluster); !slices.Equal(got, want) || len(problems) > 0 {
						t.Errorf("%s: cluster-wide %v (problems %v), want %v", sa, got, problems, want)
					}
				}
				mode := stringMap(path(one(t, docs, "ConfigMap", "gdr-config").obj, "data"))["GDR_POD_IDENTITY"]
				if want := map[bool]string{false: "", true: "workload-api"}[enabled]; mode != want {
					t.Errorf("gdr-config GDR_POD_IDENTITY %q, want %q", mode, want)
				}
			})
		}
	}
}
