package deploy

import (
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// TestExecutorsDisruptionBudget: the shipped PodDisruptionBudget covers the executor Pod the pod
// backend really creates, in its namespace, allows no voluntary eviction of it, and covers no
// Pod of the control plane (whose Deployments and Jobs may be drained as any).
func TestExecutorsDisruptionBudget(t *testing.T) {
	for _, install := range []string{"keda", "knative"} {
		t.Run(install, func(t *testing.T) {
			docs := buildKustomization(t, install)
			var pdbs []policyv1.PodDisruptionBudget
			for _, d := range docs {
				if d.kind() != "PodDisruptionBudget" {
					continue
				}
				var pdb policyv1.PodDisruptionBudget
				if err := yaml.UnmarshalStrict(d.raw, &pdb); err != nil {
					t.Fatal(err)
				}
				pdbs = append(pdbs, pdb)
			}
			if len(pdbs) != 1 {
				t.Fatalf("%d PodDisruptionBudgets, want the executors' one", len(pdbs))
			}
			pdb := pdbs[0]
			pod := executorPod(t, docs)
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil {
				t.Fatal(err)
			}
			if pdb.Namespace != pod.Namespace || !sel.Matches(labels.Set(pod.Labels)) {
				t.Fatalf("budget %s/%s (%s) does not cover executor Pod %s/%s %v", pdb.Namespace, pdb.Name, sel, pod.Namespace, pod.Name, pod.Labels)
			}
			if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 0 || pdb.Spec.MinAvailable != nil {
				t.Fatalf("budget allows evictions: maxUnavailable %v, minAvailable %v", pdb.Spec.MaxUnavailable, pdb.Spec.MinAvailable)
			}
			if pod.Annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] != "false" {
				t.Fatalf("executor Pod annotations %v: the cluster autoscaler may evict it", pod.Annotations)
			}
			templates := 0
			for _, p := range podTemplates(t, docs) {
				if p.pool != "" {
					continue // a pool's template: the executors themselves
				}
				templates++
				if sel.Matches(labels.Set(p.labels)) {
					t.Errorf("budget covers the control plane's %s", p)
				}
			}
			if templates < 4 {
				t.Fatalf("found %d Pod templates of the control plane: the walk is wrong", templates)
			}
		})
	}
}
