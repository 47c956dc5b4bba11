package pod

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WaitReason says why the Pod of assignmentID has not started its job yet,
// for a status report (read only: one Pod get, which recover's Role
// grants); "" when there is no such Pod or it is past pending. The reason is
// the scheduler's or kubelet's, as `kubectl describe` shows it: the Pod's
// PodScheduled condition when it is not scheduled (Unschedulable: 0/3 nodes
// are available: ...), else the first container waiting (ImagePullBackOff:
// Back-off pulling image ..., ContainerCreating). Neither names a
// credential: the Pod's environment is in its Secret.
func (b *Backend) WaitReason(ctx context.Context, assignmentID string) (string, error) {
	pod, err := b.client.CoreV1().Pods(b.ns).Get(ctx, b.PodName(assignmentID), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("pod backend: get Pod of assignment %s in namespace %s: %w", assignmentID, b.ns, err)
	}
	return WaitingReason(pod), nil
}

// WaitingReason is why pod, pending, does not run yet; "" for a Pod that is
// not pending. A pending Pod always gets a reason: "waiting for the
// scheduler" before the scheduler has looked at it, "Pending" when neither
// the scheduler nor kubelet said more.
func WaitingReason(pod *corev1.Pod) string {
	if pod.DeletionTimestamp != nil || (pod.Status.Phase != "" && pod.Status.Phase != corev1.PodPending) {
		return ""
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
			return joinReason(c.Reason, c.Message, "not scheduled")
		}
	}
	if pod.Spec.NodeName == "" {
		return "waiting for the scheduler"
	}
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range statuses {
			if w := cs.State.Waiting; w != nil {
				return "container " + cs.Name + ": " + joinReason(w.Reason, w.Message, "waiting")
			}
		}
	}
	return "Pending"
}

// joinReason is "reason: message", or what of it there is, or fallback.
func joinReason(reason, message, fallback string) string {
	switch {
	case reason != "" && message != "":
		return reason + ": " + message
	case reason != "":
		return reason
	case message != "":
		return message
	}
	return fallback
}
