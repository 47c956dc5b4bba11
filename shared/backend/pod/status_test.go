package pod

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestWaitingReason(t *testing.T) {
	waiting := func(name, reason, message string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}}
	}
	deleting := metav1.NewTime(time.Now())
	for _, tc := range []struct {
		name string
		pod  corev1.Pod
		want string
	}{
		{"just created", corev1.Pod{}, "waiting for the scheduler"},
		{"unschedulable", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/1 nodes are available: 1 Insufficient cpu.",
		}}}}, "Unschedulable: 0/1 nodes are available: 1 Insufficient cpu."},
		{"image pull", corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodPending,
			Conditions:        []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{waiting("runner", "ImagePullBackOff", `Back-off pulling image "x:1"`)}}},
			`container runner: ImagePullBackOff: Back-off pulling image "x:1"`},
		{"init container first", corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodPending,
			InitContainerStatuses: []corev1.ContainerStatus{waiting("setup", "PodInitializing", "")},
			ContainerStatuses:     []corev1.ContainerStatus{waiting("runner", "ContainerCreating", "")}}},
			"container setup: PodInitializing"},
		{"scheduled, kubelet silent", corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}, "Pending"},
		{"running", corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}, ""},
		{"being deleted", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := WaitingReason(&tc.pod); got != tc.want {
				t.Fatalf("WaitingReason = %q, want %q", got, tc.want)
			}
		})
	}
}
