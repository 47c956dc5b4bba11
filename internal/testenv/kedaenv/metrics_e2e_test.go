//go:build e2e

package kedaenv

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
)

// TestE2EOperatorExportsScalerActive: the series the alerts GDRDispatchAbsent and
// GDRGatewayAbsent read (deploy/prometheus; deploy's TestAbsentAlerts builds them with these
// names and labels) are what the operator exports on its metrics address: keda_scaler_active
// of a ScaledObject's trigger, labelled with the ScaledObject's namespace and name, its
// triggerIndex and type scaledobject, 1 while its scaler sees work and 0 once it sees none;
// and keda_scaled_object_paused of the ScaledObject, 0.
func TestE2EOperatorExportsScalerActive(t *testing.T) {
	Assets(t) // skip before starting anything when the operator is not built
	p := plane.Plane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := p.Namespace(t)
	op := Start(ctx, t, p.RESTConfig(), Options{WatchNamespace: ns})

	// A queue of the test's own, read by a metrics-api trigger (the scaler dispatch's
	// ScaledObject reads Gitea's queue with).
	var queued atomic.Int64
	queued.Store(2)
	queue := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"queued": %d}`, queued.Load())
	}))
	t.Cleanup(queue.Close)

	const name = "dispatch"
	zero := int32(0)
	if _, err := p.Client(t).AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &zero,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: "registry.invalid/none"}}},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(p.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	so := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"scaleTargetRef":  map[string]any{"name": name},
			"minReplicaCount": int64(0), "maxReplicaCount": int64(1), "pollingInterval": int64(1), "cooldownPeriod": int64(300),
			"triggers": []any{map[string]any{"type": "metrics-api", "metadata": map[string]any{
				"url": queue.URL, "valueLocation": "queued", "targetValue": "1", "activationTargetValue": "0",
			}}},
		},
	}}
	scaledObjects := schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledobjects"}
	if _, err := dyn.Resource(scaledObjects).Namespace(ns).Create(ctx, so, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	hc := &http.Client{Timeout: 5 * time.Second}
	// waitFor scrapes the operator until keda_scaler_active of the trigger is want, and returns
	// the scrape.
	waitFor := func(want float64) metrics.Families {
		t.Helper()
		var last metrics.Families
		for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
			fams, err := metrics.Scrape(ctx, hc, "http://"+op.MetricsAddr+"/metrics")
			if err != nil {
				t.Fatal(err)
			}
			last = fams
			if v, ok := fams.Value("keda_scaler_active", "namespace", ns, "scaledObject", name, "triggerIndex", "0", "type", "scaledobject"); ok && v == want {
				return fams
			}
		}
		t.Fatalf("keda_scaler_active of %s/%s never %v; the operator exports %v", ns, name, want, last["keda_scaler_active"])
		return nil
	}
	fams := waitFor(1)
	for _, m := range fams["keda_scaler_active"].GetMetric() {
		t.Logf("keda_scaler_active %v = %v", m.GetLabel(), m.GetGauge().GetValue())
		names := map[string]bool{}
		for _, l := range m.GetLabel() {
			names[l.GetName()] = true
		}
		for _, want := range []string{"namespace", "scaledObject", "scaler", "triggerIndex", "metric", "type"} {
			if !names[want] {
				t.Errorf("keda_scaler_active %v lacks the label %s", m.GetLabel(), want)
			}
		}
	}
	if v, ok := fams.Value("keda_scaled_object_paused", "namespace", ns, "scaledObject", name); !ok || v != 0 {
		t.Errorf("keda_scaled_object_paused of %s/%s = %v (present %v), want 0", ns, name, v, ok)
	}
	queued.Store(0) // the queue empties: idle
	waitFor(0)
}
