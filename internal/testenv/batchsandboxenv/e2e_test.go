//go:build e2e

package batchsandboxenv

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
)

var batchSandboxes = schema.GroupVersionResource{Group: "sandbox.opensandbox.io", Version: "v1alpha1", Resource: "batchsandboxes"}

// endpointsAnnotation is where the controller writes the Pods' IPs (a JSON
// list); the provider's endpoint and its Running/Allocated states read it.
const endpointsAnnotation = "sandbox.opensandbox.io/endpoints"

// TestE2EOpenSandboxKubernetesBatchSandbox runs OpenSandbox's BatchSandbox
// controller (built from the pinned source) against a real single-node
// cluster and creates BatchSandboxes exactly as the lifecycle server's
// `batchsandbox` provider does in template mode (the execd-installer init
// container, the `sandbox` container wrapped by bootstrap.sh, the
// opensandbox-bin emptyDir, the opensandbox.io/id label, spec.expireTime):
//   - Running: an entrypoint that never ends (the SDK's default, `tail -f
//     /dev/null`) gets a Pod <name>-0 owned by the BatchSandbox, on the node,
//     whose init container copied execd (execd's own banner with the pinned
//     commit is in the container's log); the BatchSandbox shows phase
//     Succeed, ready 1 and the Pod's IP in its endpoints annotation, and
//     another Pod gets 200 from execd's GET /ping at <that IP>:44772.
//   - Exit1 / Exit0: an entrypoint that exits 1 or 0. The template has no
//     restartPolicy (Always), so the kubelet restarts either and backs off;
//     the controller turns CrashLoopBackOff into phase Failed with condition
//     PodFailed, for exit 0 as for exit 1.
//   - Expiry: at spec.expireTime the controller deletes the BatchSandbox; the
//     Pod goes with it (the garbage collector, by owner reference).
//   - Delete: deleting a BatchSandbox (grace period 0, as the provider does)
//     removes it at once (no finalizer in template mode) and its Pod after.
//
// Every change of each BatchSandbox's and Pod's status is logged with the
// time since the sandboxes were created (docs/OPENSANDBOX-KUBERNETES.md).
func TestE2EOpenSandboxKubernetesBatchSandbox(t *testing.T) {
	Assets(t) // skip before starting a cluster when the peer is not built
	// Its timeout starts once a cluster slot is its (clusterenv.Reserve).
	ctx, cancel := context.WithTimeout(clusterenv.Reserve(context.Background(), t), 15*time.Minute)
	defer cancel()
	c := clusterenv.Start(ctx, t)
	ImportImages(ctx, t, c)
	mgr := Start(ctx, t, c)
	kube := c.Client(t)
	dyn, err := dynamic.NewForConfig(c.Plane.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	const ns = "opensandbox"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitServiceAccount(ctx, t, ns)

	t0 := time.Now()
	exit0Expiry := t0.Add(90 * time.Second).Truncate(time.Second)
	later := t0.Add(10 * time.Minute).Truncate(time.Second)
	sandboxes := []struct {
		name       string
		entrypoint []string
		expire     time.Time
	}{
		{"sbx-running", []string{"tail", "-f", "/dev/null"}, later},
		{"sbx-exit1", []string{"sh", "-c", "sleep 2; echo exiting 1; exit 1"}, later},
		{"sbx-exit0", []string{"sh", "-c", "sleep 2; echo exiting 0; exit 0"}, exit0Expiry},
	}
	names := make([]string, len(sandboxes))
	for i, s := range sandboxes {
		names[i] = s.name
		obj := providerBatchSandbox(ns, s.name, s.entrypoint, s.expire)
		if _, err := dyn.Resource(batchSandboxes).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create BatchSandbox %s: %v", s.name, err)
		}
	}
	rec := &recorder{t: t, kube: kube, dyn: dyn, ns: ns, t0: t0, names: names, last: map[string]snapshot{}}
	defer rec.logTimelines()

	t.Run("Running", func(t *testing.T) {
		s := rec.until(ctx, t, 3*time.Minute, "sbx-running: phase Succeed, ready 1, endpoints [pod IP]", func(m map[string]snapshot) bool {
			s := m["sbx-running"]
			return s.bs != nil && s.pod != nil && s.phase() == "Succeed" && s.count("ready") == 1 &&
				s.pod.Status.PodIP != "" && s.endpoints() == fmt.Sprintf("[%q]", s.pod.Status.PodIP)
		})["sbx-running"]
		pod := s.pod
		if pod.Name != "sbx-running-0" || pod.Spec.NodeName != clusterenv.NodeName {
			t.Errorf("pod %s on node %q, want sbx-running-0 on %s", pod.Name, pod.Spec.NodeName, clusterenv.NodeName)
		}
		if ref := metav1.GetControllerOf(pod); ref == nil || ref.Kind != "BatchSandbox" || ref.UID != s.bs.GetUID() {
			t.Errorf("pod's controller = %+v, want the BatchSandbox %s", ref, s.bs.GetUID())
		}
		if pod.Labels["opensandbox.io/id"] != "sbx-running" {
			t.Errorf("pod labels %v lack the template's opensandbox.io/id", pod.Labels)
		}
		if len(pod.Status.InitContainerStatuses) != 1 || pod.Status.InitContainerStatuses[0].State.Terminated == nil ||
			pod.Status.InitContainerStatuses[0].State.Terminated.ExitCode != 0 {
			t.Errorf("execd-installer: %+v, want terminated with exit code 0", pod.Status.InitContainerStatuses)
		}
		if s.pod.Status.Phase != corev1.PodRunning || !podReady(pod) {
			t.Errorf("pod phase %s ready %v, want Running and Ready", pod.Status.Phase, podReady(pod))
		}
		// execd runs in the sandbox container: bootstrap.sh's line, then execd's banner.
		var log string
		deadline := time.Now().Add(30 * time.Second)
		for {
			b, err := kube.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "sandbox"}).DoRaw(ctx)
			log = string(b)
			if err == nil && strings.Contains(log, "Git Commit  : "+Commit) || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("sbx-running's sandbox container log:\n%s", log)
		for _, want := range []string{"starting OpenSandbox Execd daemon at /opt/opensandbox/execd.", " OpenSandbox Execd",
			"Git Commit  : " + Commit, "execd listening on :44772"} {
			if !strings.Contains(log, want) {
				t.Errorf("sandbox container log lacks %q", want)
			}
		}
		status, _, _ := unstructured.NestedMap(s.bs.Object, "status")
		t.Logf("sbx-running: annotations %v, status %v", s.bs.GetAnnotations(), status)
		// The endpoint the server's direct ingress answers is <endpoints[0]>:<port>:
		// another Pod reaches execd there.
		probe := execdProbe(ctx, t, kube, ns, "execd-ping", s.pod.Status.PodIP+":44772")
		if !strings.Contains(probe, " 200 OK") || !strings.Contains(probe, "nc-exit=0") {
			t.Errorf("GET /ping of execd at the sandbox's endpoint: %q, want 200 OK", probe)
		}
	})

	for _, name := range []string{"sbx-exit1", "sbx-exit0"} {
		code := strings.TrimPrefix(name, "sbx-exit")
		t.Run("Exit"+code, func(t *testing.T) {
			s := rec.until(ctx, t, 3*time.Minute, name+": phase Failed with PodFailed", func(m map[string]snapshot) bool {
				s := m[name]
				return s.bs != nil && s.phase() == "Failed" && s.condition("PodFailed") != ""
			})[name]
			status, _, _ := unstructured.NestedMap(s.bs.Object, "status")
			t.Logf("%s: status %v", name, status)
			if got := s.condition("PodFailed"); !strings.HasPrefix(got, "True/CrashLoopBackOff") {
				t.Errorf("PodFailed = %q, want True/CrashLoopBackOff", got)
			}
			if s.pod == nil || len(s.pod.Status.ContainerStatuses) != 1 {
				t.Fatalf("%s: pod %+v", name, s.pod)
			}
			cs := s.pod.Status.ContainerStatuses[0]
			if cs.RestartCount < 1 || cs.LastTerminationState.Terminated == nil || fmt.Sprint(cs.LastTerminationState.Terminated.ExitCode) != code {
				t.Errorf("%s: container restarts %d, last state %+v; want a restart after exit code %s", name, cs.RestartCount, cs.LastTerminationState, code)
			}
			if s.pod.Spec.RestartPolicy != corev1.RestartPolicyAlways {
				t.Errorf("%s: restartPolicy %s, want the default Always", name, s.pod.Spec.RestartPolicy)
			}
		})
	}

	t.Run("Expiry", func(t *testing.T) {
		before := rec.snapshot(ctx, t)["sbx-exit0"]
		if before.bs == nil {
			t.Fatalf("sbx-exit0 is gone at %s, before its expireTime %s", time.Now().Format(time.RFC3339), exit0Expiry.Format(time.RFC3339))
		}
		rec.until(ctx, t, time.Until(exit0Expiry)+time.Minute, "sbx-exit0 and its Pod gone", func(m map[string]snapshot) bool {
			return m["sbx-exit0"].bs == nil && m["sbx-exit0"].pod == nil
		})
		if now := time.Now(); now.Before(exit0Expiry) {
			t.Errorf("sbx-exit0 gone at %s, before its expireTime %s", now.Format(time.RFC3339Nano), exit0Expiry.Format(time.RFC3339))
		}
		if !strings.Contains(mgr.Log(), "batch sandbox expired, delete") {
			t.Errorf("the manager did not log deleting the expired sandbox")
		}
	})

	t.Run("Delete", func(t *testing.T) {
		zero := int64(0)
		if err := dyn.Resource(batchSandboxes).Namespace(ns).Delete(ctx, "sbx-running", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(batchSandboxes).Namespace(ns).Get(ctx, "sbx-running", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("BatchSandbox right after delete: %v, want NotFound (no finalizer)", err)
		}
		rec.until(ctx, t, 2*time.Minute, "sbx-running's Pod gone", func(m map[string]snapshot) bool {
			return m["sbx-running"].pod == nil
		})
	})
}

// execdProbe runs a Pod of SandboxImage that asks execd's GET /ping at addr
// (host:port; HTTP/1.0 by busybox nc, 5 s timeout), waits until it ends, and
// returns its log: the response and "nc-exit=<code>".
func execdProbe(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns, name, addr string) string {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "probe", Image: SandboxImage, ImagePullPolicy: corev1.PullNever,
				// busybox nc, not wget: Debian's static busybox wget dies with SIGSEGV here.
				Command: []string{"/bin/sh", "-c", "printf 'GET /ping HTTP/1.0\\r\\n\\r\\n' | nc -w 5 " + strings.Replace(addr, ":", " ", 1) + "; rc=$?; echo; echo nc-exit=$rc"},
			}},
		},
	}
	if _, err := kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create probe Pod: %v", err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p, err := kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("probe Pod: %v", err)
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe Pod still %s after 2m", p.Status.Phase)
		}
		time.Sleep(250 * time.Millisecond)
	}
	b, err := kube.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("probe Pod's log: %v", err)
	}
	t.Logf("probe of execd at %s:\n%s", addr, b)
	return string(b)
}

// providerBatchSandbox is the BatchSandbox the lifecycle server's
// batchsandbox provider creates in template mode for sandbox id name (no
// template file, no resource limits, network policy or volumes), the
// image SandboxImage with pull policy IfNotPresent (the provider's default)
// and ExecdImage as execd_image.
func providerBatchSandbox(ns, name string, entrypoint []string, expire time.Time) *unstructured.Unstructured {
	labels := map[string]any{"opensandbox.io/id": name}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "sandbox.opensandbox.io/v1alpha1",
		"kind":       "BatchSandbox",
		"metadata":   map[string]any{"name": name, "namespace": ns, "labels": labels},
		"spec": map[string]any{
			"replicas":   int64(1),
			"expireTime": expire.UTC().Format(time.RFC3339),
			"template": map[string]any{
				"metadata": map[string]any{"labels": labels, "annotations": map[string]any{}},
				"spec": map[string]any{
					"initContainers": []any{map[string]any{
						"name":    "execd-installer",
						"image":   ExecdImage,
						"command": []any{"/bin/sh", "-c"},
						"args": []any{"cp ./execd /opt/opensandbox/execd && cp ./bootstrap.sh /opt/opensandbox/bootstrap.sh && " +
							"chmod +x /opt/opensandbox/execd && chmod +x /opt/opensandbox/bootstrap.sh"},
						"volumeMounts": []any{map[string]any{"name": "opensandbox-bin", "mountPath": "/opt/opensandbox"}},
					}},
					"containers": []any{map[string]any{
						"name":            "sandbox",
						"image":           SandboxImage,
						"imagePullPolicy": "IfNotPresent",
						"command":         toAny(append([]string{"/opt/opensandbox/bootstrap.sh"}, entrypoint...)),
						"env":             []any{map[string]any{"name": "EXECD", "value": "/opt/opensandbox/execd"}},
						"volumeMounts":    []any{map[string]any{"name": "opensandbox-bin", "mountPath": "/opt/opensandbox"}},
					}},
					"volumes": []any{map[string]any{"name": "opensandbox-bin", "emptyDir": map[string]any{}}},
				},
			},
		},
	}}
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// snapshot is one sandbox's BatchSandbox and Pod (<name>-0) as last read;
// nil when absent.
type snapshot struct {
	bs  *unstructured.Unstructured
	pod *corev1.Pod
}

func (s snapshot) phase() string {
	p, _, _ := unstructured.NestedString(s.bs.Object, "status", "phase")
	return p
}

func (s snapshot) count(field string) int64 {
	n, _, _ := unstructured.NestedInt64(s.bs.Object, "status", field)
	return n
}

func (s snapshot) endpoints() string { return s.bs.GetAnnotations()[endpointsAnnotation] }

// condition is "Status/Reason: message" of the BatchSandbox's condition typ,
// "" when it has none.
func (s snapshot) condition(typ string) string {
	conds, _, _ := unstructured.NestedSlice(s.bs.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			return fmt.Sprintf("%v/%v: %v", m["status"], m["reason"], m["message"])
		}
	}
	return ""
}

// String is the status fields the timeline records.
func (s snapshot) String() string {
	var b strings.Builder
	if s.bs == nil {
		b.WriteString("BatchSandbox: absent")
	} else {
		conds, _, _ := unstructured.NestedSlice(s.bs.Object, "status", "conditions")
		var cs []string
		for _, c := range conds {
			m, _ := c.(map[string]any)
			cs = append(cs, fmt.Sprintf("%v=%v/%v", m["type"], m["status"], m["reason"]))
		}
		fmt.Fprintf(&b, "BatchSandbox: phase=%q replicas=%d allocated=%d ready=%d conditions=[%s] endpoints=%s",
			s.phase(), s.count("replicas"), s.count("allocated"), s.count("ready"), strings.Join(cs, " "), s.endpoints())
		if s.bs.GetDeletionTimestamp() != nil {
			b.WriteString(" deleting")
		}
	}
	if s.pod == nil {
		b.WriteString(" | Pod: absent")
		return b.String()
	}
	p := s.pod
	fmt.Fprintf(&b, " | Pod: phase=%s ready=%v ip=%s", p.Status.Phase, podReady(p), p.Status.PodIP)
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		fmt.Fprintf(&b, " %s=%s", cs.Name, containerState(cs.State))
		if cs.RestartCount > 0 {
			fmt.Fprintf(&b, " restarts=%d last=%s", cs.RestartCount, containerState(cs.LastTerminationState))
		}
	}
	if p.DeletionTimestamp != nil {
		b.WriteString(" deleting")
	}
	return b.String()
}

func containerState(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Waiting != nil:
		return "waiting(" + s.Waiting.Reason + ")"
	case s.Terminated != nil:
		return fmt.Sprintf("terminated(%s,exit %d)", s.Terminated.Reason, s.Terminated.ExitCode)
	}
	return "none"
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// recorder polls the sandboxes' BatchSandboxes and Pods and keeps, per
// sandbox, every distinct status it saw, with the time since t0.
type recorder struct {
	t     *testing.T
	kube  kubernetes.Interface
	dyn   dynamic.Interface
	ns    string
	t0    time.Time
	names []string

	mu        sync.Mutex
	last      map[string]snapshot
	timelines []string // "<name> +<seconds>s <status>", in order seen
}

// snapshot reads every sandbox once and records the ones that changed.
func (r *recorder) snapshot(ctx context.Context, t *testing.T) map[string]snapshot {
	t.Helper()
	out := map[string]snapshot{}
	for _, name := range r.names {
		var s snapshot
		bs, err := r.dyn.Resource(batchSandboxes).Namespace(r.ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			s.bs = bs
		case !apierrors.IsNotFound(err):
			t.Fatalf("get BatchSandbox %s: %v", name, err)
		}
		pod, err := r.kube.CoreV1().Pods(r.ns).Get(ctx, name+"-0", metav1.GetOptions{})
		switch {
		case err == nil:
			s.pod = pod
		case !apierrors.IsNotFound(err):
			t.Fatalf("get Pod %s-0: %v", name, err)
		}
		out[name] = s
		r.mu.Lock()
		if prev, ok := r.last[name]; !ok || prev.String() != s.String() {
			line := fmt.Sprintf("%s +%.1fs %s", name, time.Since(r.t0).Seconds(), s)
			r.timelines = append(r.timelines, line)
			r.t.Log(line)
		}
		r.last[name] = s
		r.mu.Unlock()
	}
	return out
}

// until polls every 250 ms until done holds for a snapshot, and returns it;
// it fails the test after timeout.
func (r *recorder) until(ctx context.Context, t *testing.T, timeout time.Duration, what string, done func(map[string]snapshot) bool) map[string]snapshot {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m := r.snapshot(ctx, t)
		if done(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// logTimelines logs every status recorded, grouped by sandbox.
func (r *recorder) logTimelines() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range r.names {
		var lines []string
		for _, l := range r.timelines {
			if strings.HasPrefix(l, name+" ") {
				lines = append(lines, l)
			}
		}
		r.t.Logf("timeline of %s:\n%s", name, strings.Join(lines, "\n"))
	}
}
