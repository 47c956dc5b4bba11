//go:build e2e

package clusterenv

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestE2EClusterPod starts the cluster and runs a Pod bound to the node
// (nodeName, no scheduler involved) from a locally built image, to
// Succeeded, then reads its log through the API server (which asks the
// kubelet).
func TestE2EClusterPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	c := Start(ctx, t)
	t.Logf("cluster up, node Ready, in %v", time.Since(t0).Round(time.Millisecond))
	hello, err := BuildImage(ctx, t, "hello", "./internal/imagebuild/testdata/hello")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ImportImage(ctx, hello, "gdr.local/hello"); err != nil {
		t.Fatal(err)
	}
	cs := c.Client(t)
	ns := c.Plane.Namespace(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello"},
		Spec: corev1.PodSpec{
			NodeName:      NodeName,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "hello", Image: "gdr.local/hello:latest", ImagePullPolicy: corev1.PullNever,
				Args: []string{"--version"},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	var phase corev1.PodPhase
	for phase != corev1.PodSucceeded {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		phase = p.Status.Phase
		if phase == corev1.PodFailed || ctx.Err() != nil {
			c.DumpLogs(t)
			t.Fatalf("pod %s: %+v", phase, p.Status)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("pod Succeeded %v after create", time.Since(t1).Round(time.Millisecond))
	rc, err := cs.CoreV1().Pods(ns).GetLogs("hello", &corev1.PodLogOptions{Container: "hello"}).Stream(ctx)
	if err != nil {
		c.DumpLogs(t)
		t.Fatalf("logs through the API server: %v", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), "hello go") {
		t.Fatalf("log %q, want hello go...", b)
	}
	t.Logf("log through the API server: %q", strings.TrimSpace(string(b)))
}
