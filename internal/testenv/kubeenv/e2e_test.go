//go:build e2e

package kubeenv

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
