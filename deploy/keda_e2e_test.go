//go:build e2e

package deploy

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kedaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// handlePodYAML is the shipped ScaledJob of the pod backend's handle.
const handlePodYAML = "keda/03-handle-pod.yaml"

var scaledJobs = schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledjobs"}

// TestE2EKEDAScalesHandlePod runs the shipped ScaledJob of handle (pod
// backend) under KEDA's real operator, reading a real nats-server's /jsz:
// until the ConfigMaps and the Secret its template reads exist, KEDA starts
// no Job; while the consumer handle-setup makes is missing, KEDA reports a trigger
// error and starts no Job (KEDA >= 2.20; earlier versions scaled to the
// maximum); with the consumer and no message it starts none either; after two
// assignments it starts exactly two Jobs from the handle template (lag 2,
// lagThreshold 1) and no more while they run. The Jobs never run: the plane
// has no controller manager and no kubelet. On failure kedaenv prints the
// operator's log. The operator itself (its version, its listeners) is
// kedaenv's TestE2EOperatorListensOnLoopback.
func TestE2EKEDAScalesHandlePod(t *testing.T) {
	kedaenv.Assets(t) // skip before starting anything when the operator is not built
	p := plane.Plane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := p.Namespace(t)
	q := jetstreamenv.NewQueue(t) // stream CI_RUNNER, no consumer yet
	cfg := p.RESTConfig()
	kedaenv.Start(ctx, t, cfg, kedaenv.Options{WatchNamespace: ns})
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kube := p.Client(t)

	sj := shippedScaledJob(t, ns, q.Server.MonitorAddr().String())
	interval := time.Duration(mustInt64(t, sj, "spec", "pollingInterval")) * time.Second
	maxReplicas := mustInt64(t, sj, "spec", "maxReplicaCount")
	if _, err := dyn.Resource(scaledJobs).Namespace(ns).Create(ctx, sj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ScaledJob %s: %v", sj.GetName(), err)
	}
	jobs := func() []batchv1.Job {
		t.Helper()
		l, err := kube.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: "scaledjob.keda.sh/name=" + sj.GetName()})
		if err != nil {
			t.Fatalf("list Jobs: %v", err)
		}
		return l.Items
	}
	// noJobsFor fails the test if any Job appears within d.
	noJobsFor := func(phase string, d time.Duration) {
		t.Helper()
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(interval / 4) {
			if js := jobs(); len(js) != 0 {
				t.Fatalf("%s: KEDA created %d Job(s), want none", phase, len(js))
			}
		}
	}
	condition := func(typ string) (status, reason string) {
		t.Helper()
		u, err := dyn.Resource(scaledJobs).Namespace(ns).Get(ctx, sj.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get ScaledJob: %v", err)
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == typ {
				s, _ := m["status"].(string)
				r, _ := m["reason"].(string)
				return s, r
			}
		}
		return "", ""
	}
	waitCondition := func(phase, typ, status, reason string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			s, r := condition(typ)
			if s == status && (reason == "" || r == reason) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: ScaledJob condition %s = %q (reason %q), want %q (reason %q)", phase, typ, s, r, status, reason)
			}
			time.Sleep(interval / 4)
		}
	}

	// 0. KEDA resolves the template's environment (envFrom, configMapKeyRef,
	// secretKeyRef) before it reads the trigger: without the ConfigMaps and
	// the Secret the base kustomization makes, the ScaledJob is not ready
	// and no Job is created.
	waitCondition("no configuration", "Ready", "False", "")
	noJobsFor("no configuration", 2*interval)
	createTemplateConfig(t, ctx, kube, ns)

	// 1. No consumer (handle-setup has not run): the trigger errs, no Job.
	waitCondition("no consumer", "Ready", "False", "TriggerError")
	noJobsFor("no consumer", 3*interval)

	// 2. The consumer, as handle-setup makes it, and no message: ready, not active, no Job.
	q.OpenConsumer(t, taskassignment.BackendPod, int(maxReplicas))
	waitCondition("empty consumer", "Ready", "True", "")
	waitCondition("empty consumer", "Active", "False", "")
	noJobsFor("empty consumer", 3*interval)

	// 3. Two assignments: two Jobs from the handle template, and no more.
	const published = 2
	subject := assignmentqueue.Subject(taskassignment.BackendPod)
	for i := range published {
		if _, err := q.JetStream.Publish(ctx, subject, []byte("assignment "+strconv.Itoa(i))); err != nil {
			t.Fatalf("publish on %s: %v", subject, err)
		}
	}
	start := time.Now()
	for len(jobs()) == 0 {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("no Job 30s after %d messages on %s", published, subject)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("first Job %v after the messages (pollingInterval %v)", time.Since(start).Round(time.Millisecond), interval)
	waitCondition("two messages", "Active", "True", "")
	waitCondition("two messages", "Ready", "True", "")
	time.Sleep(3 * interval) // KEDA counts the Jobs as running: it must not add more
	got := jobs()
	if len(got) != published {
		t.Fatalf("%d Jobs after %d messages and 3 more polling intervals, want %d (one per message)", len(got), published, published)
	}
	for _, j := range got {
		checkHandleJob(t, j, sj.GetName())
	}
}

// createTemplateConfig creates the objects the handle template reads its
// environment from, with placeholder values (the Jobs never run).
func createTemplateConfig(t *testing.T, ctx context.Context, kube kubernetes.Interface, ns string) {
	t.Helper()
	for _, cm := range []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: "gdr-config"}, Data: map[string]string{"GDR_LOG_LEVEL": "info"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "gdr-assignment-verify-keys"}, Data: map[string]string{"verify-keys": "placeholder"}},
	} {
		if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ConfigMap %s: %v", cm.Name, err)
		}
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gdr-secrets"}, StringData: map[string]string{"bootstrap-key": "placeholder"}}
	if _, err := kube.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Secret %s: %v", secret.Name, err)
	}
}

// shippedScaledJob decodes handlePodYAML and points it at namespace ns and
// the monitoring endpoint monitor (host:port), changing nothing else.
func shippedScaledJob(t *testing.T, ns, monitor string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(handlePodYAML)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatalf("%s: %v", handlePodYAML, err)
	}
	u := &unstructured.Unstructured{Object: obj}
	if u.GetKind() != "ScaledJob" {
		t.Fatalf("%s holds a %s, want a ScaledJob", handlePodYAML, u.GetKind())
	}
	u.SetNamespace(ns)
	triggers, _, _ := unstructured.NestedSlice(obj, "spec", "triggers")
	if len(triggers) != 1 {
		t.Fatalf("%s has %d triggers, want 1", handlePodYAML, len(triggers))
	}
	trigger := triggers[0].(map[string]any)
	if trigger["type"] != "nats-jetstream" {
		t.Fatalf("%s: trigger type %v, want nats-jetstream", handlePodYAML, trigger["type"])
	}
	md := trigger["metadata"].(map[string]any)
	if _, ok := md["natsServerMonitoringEndpoint"]; !ok {
		t.Fatalf("%s: the trigger has no natsServerMonitoringEndpoint", handlePodYAML)
	}
	md["natsServerMonitoringEndpoint"] = monitor
	if err := unstructured.SetNestedSlice(obj, triggers, "spec", "triggers"); err != nil {
		t.Fatal(err)
	}
	return u
}

func mustInt64(t *testing.T, u *unstructured.Unstructured, path ...string) int64 {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(u.Object, path...)
	if n, isInt := v.(int64); ok && err == nil && isInt {
		return n
	}
	if f, isFloat := v.(float64); ok && err == nil && isFloat { // sigs.k8s.io/yaml decodes numbers as float64
		return int64(f)
	}
	t.Fatalf("%s: %s = %v (%T), %v", handlePodYAML, strings.Join(path, "."), v, v, err)
	return 0
}

// checkHandleJob checks that j is made from the shipped handle template and
// owned by the ScaledJob.
func checkHandleJob(t *testing.T, j batchv1.Job, scaledJob string) {
	t.Helper()
	tl := j.Spec.Template.Labels
	if tl["app.kubernetes.io/name"] != "handle" || tl["app.kubernetes.io/part-of"] != "gitea-dynamic-runner" {
		t.Errorf("Job %s: template labels %v, want handle's", j.Name, tl)
	}
	if j.Labels["app.kubernetes.io/managed-by"] != "keda-operator" || j.Labels["app.kubernetes.io/version"] != strings.TrimPrefix(kedaenv.Version, "v") {
		t.Errorf("Job %s: labels %v, want managed by keda-operator %s", j.Name, j.Labels, kedaenv.Version)
	}
	if c := metav1.GetControllerOf(&j); c == nil || c.Kind != "ScaledJob" || c.Name != scaledJob {
		t.Errorf("Job %s: owners %v, want ScaledJob %s as controller", j.Name, j.OwnerReferences, scaledJob)
	}
	cs := j.Spec.Template.Spec.Containers
	if len(cs) != 1 || !slices.Equal(cs[0].Command, []string{"handle"}) {
		t.Fatalf("Job %s: containers %+v, want handle's", j.Name, cs)
	}
	env := map[string]string{}
	for _, e := range cs[0].Env {
		env[e.Name] = e.Value
	}
	if env["GDR_MODE"] != "job" || env["GDR_BACKEND"] != "pod" {
		t.Errorf("Job %s: GDR_MODE=%q GDR_BACKEND=%q, want job, pod", j.Name, env["GDR_MODE"], env["GDR_BACKEND"])
	}
	if j.Spec.ActiveDeadlineSeconds == nil || *j.Spec.ActiveDeadlineSeconds != 600 || j.Spec.Template.Spec.ServiceAccountName != "gitea-dynamic-runner-handle" {
		t.Errorf("Job %s: activeDeadlineSeconds %v, serviceAccountName %q, want the template's", j.Name, j.Spec.ActiveDeadlineSeconds, j.Spec.Template.Spec.ServiceAccountName)
	}
}
