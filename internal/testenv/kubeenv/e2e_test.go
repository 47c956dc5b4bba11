//go:build e2e

package kubeenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

var plane Shared

func TestMain(m *testing.M) {
	code := m.Run()
	plane.Stop()
	os.Exit(code)
}

func TestE2EPlane(t *testing.T) {
	p := plane.Plane(t)
	c := p.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := c.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != Version {
		t.Fatalf("kube-apiserver reports %s, want %s", v.GitVersion, Version)
	}
	ns := p.Namespace(t)
	if ns2 := p.Namespace(t); ns2 == ns {
		t.Fatal("two tests share a namespace")
	}
	for _, tc := range []struct {
		name  string
		value string
		ok    bool
	}{
		{"63", strings.Repeat("a", 63), true},
		{"64", strings.Repeat("a", 64), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "p" + tc.name, Labels: map[string]string{"v": tc.value}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
			}
			_, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			if tc.ok != (err == nil) || (!tc.ok && !apierrors.IsInvalid(err)) {
				t.Fatalf("create with a %d-character label value: %v", len(tc.value), err)
			}
		})
	}
	if p.watchdog == nil {
		t.Error("no watchdog guards the control plane")
	}
}

// TestE2EAuditLog starts a plane of its own with the audit log on and an extra flag, and finds
// an impersonated call in the log, with the impersonated user and the resource.
func TestE2EAuditLog(t *testing.T) {
	if p := plane.Plane(t); p.AuditLog() != "" {
		t.Fatalf("a plane started without options writes an audit log at %s", p.AuditLog())
	}
	p, err := StartWith(Assets(t), Options{Audit: true, APIServerArgs: map[string][]string{"audit-log-maxbackup": {"1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := p.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:default:someone"}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ConfigMaps("default").Get(ctx, "audit-probe", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("get as a ServiceAccount without a Role: %v, want forbidden", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		data, err := os.ReadFile(p.AuditLog())
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, `"name":"audit-probe"`) && strings.Contains(line, `"impersonatedUser":{"username":"system:serviceaccount:default:someone"`) &&
				strings.Contains(line, `"resource":"configmaps"`) && strings.Contains(line, `"code":403`) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audit event for the probe in %s", p.AuditLog())
		}
	}
}

// TestE2EStoppingOnePlaneLeavesAnotherRunning: a package's shared plane, started first, keeps
// answering after a second plane of the same binaries (a test's cluster) starts and stops; the
// second plane's watchdog watches its own processes only.
func TestE2EStoppingOnePlaneLeavesAnotherRunning(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	shared := plane.Plane(t)
	paths := []string{Assets(t) + "/etcd", Assets(t) + "/kube-apiserver"}
	before, err := childrenRunning(paths)
	if err != nil || len(before) < 2 {
		t.Fatalf("the shared plane's processes: %v, %v", before, err)
	}
	second, err := StartWith(Assets(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := childrenRunning(paths)
	if len(all) < len(before)+2 {
		t.Fatalf("children %v: the second plane's processes are not among them", all)
	}
	if second.watchdog == nil || len(second.watchdog.cmd.Args) != 4+len(all)-len(before) {
		t.Fatalf("the second plane's watchdog watches %v; want its own %d processes", second.watchdog.cmd.Args, len(all)-len(before))
	}
	if err := second.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(7 * time.Second) // the watchdog's TERM, then KILL after 5 s
	if _, err := kubernetes.NewForConfigOrDie(shared.Config).CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("the shared plane no longer answers after another plane stopped: %v", err)
	}
}

// Requests counts what clients asked, by verb and resource: three Pods
// created and one listed show as three POSTs and one LIST more, beside the
// API server's own LIST limitranges (LimitRanger admission, on the first Pod
// of a namespace); a kubeconfig written by WriteKubeconfig reaches the same
// server.
func TestE2ERequests(t *testing.T) {
	p := plane.Plane(t)
	ns := p.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := t.TempDir() + "/kubeconfig"
	if err := p.WriteKubeconfig(path); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	before, err := p.Requests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i)},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	after, err := p.Requests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := after.Minus(before).Without("limitranges")
	if got["POST pods"] != 3 || got["LIST pods"] != 1 || got.Total() != 4 {
		t.Fatalf("requests %v (%s), want 3 POST pods and 1 LIST pods", got, got.Per(1))
	}
	if w := got.Without("pods"); len(w) != 0 {
		t.Fatalf("Without(pods) = %v, want none", w)
	}
	if o := after.Minus(before).Only("limitranges", "pods"); o.Total() < 4 || o["POST pods"] != 3 {
		t.Fatalf("Only(limitranges, pods) = %v, want the 4 requests for pods and the server's own", o)
	}
}
