//go:build e2e

package deploy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
)

// TestE2EExecutorsAdmissionPolicy creates deploy/admission's objects in a real kube-apiserver
// (kubeenv: no kubelet, so Pods stay Pending) and asks it TestExecutorsAdmissionPolicy's
// questions: a Pod created with server-side dry run, or an existing Pod given an ephemeral
// container through pods/ephemeralcontainers (dry run too). The API server's answer is the
// policy's: its own compilation, type checking, parameter and binding resolution. Docker is
// enabled in the parameters, as deploy/README.md's "Docker workflows" has an operator do.
func TestE2EExecutorsAdmissionPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs := plane.Plane(t).Client(t)
	objs := enableDocker(t, loadAdmission(t))
	for _, ns := range []string{jobsNamespace, "elsewhere"} {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	policy, binding := objs.policy.DeepCopy(), objs.binding.DeepCopy()
	if objs.params != nil {
		if _, err := cs.CoreV1().ConfigMaps(objs.params.Namespace).Create(ctx, objs.params.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.CoreV1().ConfigMaps(objs.params.Namespace).Delete(context.Background(), objs.params.Name, metav1.DeleteOptions{})
		})
	}
	policies := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	bindings := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	if _, err := policies.Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = policies.Delete(context.Background(), policy.Name, metav1.DeleteOptions{}) })
	if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bindings.Delete(context.Background(), binding.Name, metav1.DeleteOptions{}) })

	built := buildExecutorPod(t, buildImage(objs), dockerTestImage)
	built.ResourceVersion, built.UID, built.CreationTimestamp = "", "", metav1.Time{}
	t.Cleanup(func() { // the ephemeral cases' Pod, never bound: deleted at once
		_ = cs.CoreV1().Pods(built.Namespace).Delete(context.Background(), built.Name, metav1.DeleteOptions{})
	})
	admit := func(p, old *corev1.Pod, subresource string) error {
		return admitE2E(ctx, t, cs, p, old, subresource)
	}
	// The policy is enforced once the API server has loaded it: wait for it to refuse the
	// job's container adding SETUID.
	bad := built.DeepCopy()
	containerNamed(bad, pod.RunnerContainer).SecurityContext.Capabilities.Add = []corev1.Capability{"SETUID"}
	for deadline := time.Now().Add(time.Minute); admit(bad, nil, "") == nil; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the API server does not enforce the policy after a minute")
		}
	}
	if st, err := policies.Get(ctx, policy.Name, metav1.GetOptions{}); err == nil && st.Status.TypeChecking != nil {
		for _, w := range st.Status.TypeChecking.ExpressionWarnings {
			t.Errorf("the API server's type checking warns about %s: %s", w.FieldRef, w.Warning)
		}
	}
	checkAdmission(t, built, admit)
	// Baseline's checks (TestExecutorsAdmissionPolicyBaseline's cases): the policy's refusal,
	// unless the API server's validation refuses the Pod before admission (its reason logged).
	for _, tc := range baselineCases() {
		t.Run("Baseline/"+string(tc.id)+"/"+tc.name, func(t *testing.T) {
			p := built.DeepCopy()
			p.Name += "-baseline" // the ephemeral cases' Pod exists under built's name
			tc.edit(p)
			err := admit(p, nil, "")
			byPolicy := err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy.Name+"'")
			switch {
			case tc.admit && byPolicy:
				t.Fatalf("refused what baseline admits: %v", err)
			case err != nil && !byPolicy && apierrors.IsInvalid(err):
				t.Logf("invalid before admission: %v", err)
			case err != nil && !byPolicy:
				t.Fatal(err)
			case !tc.admit && !byPolicy:
				t.Fatal("admitted what baseline refuses")
			}
		})
	}
}

// admitE2E asks the API server: p created (old nil) with dry run, or, for subresource
// "ephemeralcontainers", old created for real (once per name) and its ephemeral containers
// updated to p's with dry run.
func admitE2E(ctx context.Context, t *testing.T, cs kubernetes.Interface, p, old *corev1.Pod, subresource string) error {
	t.Helper()
	dry := []string{metav1.DryRunAll}
	switch subresource {
	case "":
		_, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{DryRun: dry})
		return err
	case "ephemeralcontainers":
		stored, err := cs.CoreV1().Pods(old.Namespace).Get(ctx, old.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			stored, err = cs.CoreV1().Pods(old.Namespace).Create(ctx, old, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatalf("the Pod to add an ephemeral container to: %v", err)
		}
		stored.Spec.EphemeralContainers = p.Spec.EphemeralContainers
		_, err = cs.CoreV1().Pods(stored.Namespace).UpdateEphemeralContainers(ctx, stored.Name, stored, metav1.UpdateOptions{DryRun: dry})
		return err
	}
	return errors.New("admitE2E: unknown subresource " + subresource)
}
