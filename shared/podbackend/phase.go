package podbackend

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskworker"
)

// PhaseOf maps a Pod onto the worker's phases. A Pod being deleted is
// PhaseUnknown whatever its status says: it is on its way out and must be
// neither reported nor bound as if it were settled. A Pod with no phase yet
// (just created) is pending; a phase this code does not know is unknown.
func PhaseOf(pod *corev1.Pod) taskworker.Phase {
	if pod.DeletionTimestamp != nil {
		return taskworker.PhaseUnknown
	}
	switch pod.Status.Phase {
	case "", corev1.PodPending:
		return taskworker.PhasePending
	case corev1.PodRunning:
		return taskworker.PhaseRunning
	case corev1.PodSucceeded:
		return taskworker.PhaseSucceeded
	case corev1.PodFailed:
		return taskworker.PhaseFailed
	default: // corev1.PodUnknown (lost node) and anything newer
		return taskworker.PhaseUnknown
	}
}
