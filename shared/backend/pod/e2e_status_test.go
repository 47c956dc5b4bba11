//go:build e2e

package pod

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Against the real API server (no scheduler, no kubelet: the test writes
// the status they would): WaitReason follows a Pending Pod from created to
// unschedulable (the PodScheduled condition the scheduler sets) to waiting
// on its image once bound, and says nothing of a Pod that runs or does not
// exist. No reason shows the executor's environment.
func TestE2EWaitReason(t *testing.T) {
	env := newEnv(t)
	ctx := ctxT(t)
	b := env.backend(t, deleteOnly{})
	a := testAssignment(t, 4, "")
	e, err := b.Create(ctx, a, launch(env.keys, a))
	if err != nil {
		t.Fatal(err)
	}
	reason := func() string {
		t.Helper()
		r, err := b.WaitReason(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(r, secretValue) {
			t.Fatalf("reason shows the environment: %q", r)
		}
		return r
	}
	updateStatus := func(f func(p *corev1.Pod)) {
		t.Helper()
		p, err := env.client.CoreV1().Pods(env.ns).Get(ctx, e.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f(p)
		if _, err := env.client.CoreV1().Pods(env.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := reason(); got != "waiting for the scheduler" {
		t.Fatalf("just created: %q", got)
	}
	const unschedulable = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
	updateStatus(func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodPending
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable, Message: unschedulable, LastTransitionTime: metav1.Now()}}
	})
	if got := reason(); got != "Unschedulable: "+unschedulable {
		t.Fatalf("unschedulable: %q", got)
	}
	env.schedule(t, e.Name, env.ns+"-node", true)
	updateStatus(func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "runner", Image: "registry.invalid/nope:1",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: `Back-off pulling image "registry.invalid/nope:1"`}}}}
	})
	if got := reason(); got != `container runner: ImagePullBackOff: Back-off pulling image "registry.invalid/nope:1"` {
		t.Fatalf("image pull: %q", got)
	}
	env.setPhase(t, e.Name, corev1.PodRunning)
	if got := reason(); got != "" {
		t.Fatalf("running: %q", got)
	}
	if got, err := b.WaitReason(ctx, testAssignment(t, 99, "").ID); err != nil || got != "" {
		t.Fatalf("no Pod: %q, %v", got, err)
	}
}
