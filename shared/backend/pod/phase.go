package pod

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
)

// PhaseOf maps a Pod onto the worker's phases. A Pod being deleted is
// PhaseUnknown whatever its status says: it is on its way out and must be
// neither reported nor bound as if it were settled. A Pod with no phase yet
// (just created) is pending; a phase this code does not know is unknown.
func PhaseOf(pod *corev1.Pod) executor.Phase {
	if pod.DeletionTimestamp != nil {
		return executor.PhaseUnknown
	}
	switch pod.Status.Phase {
	case "", corev1.PodPending:
		return executor.PhasePending
	case corev1.PodRunning:
		return executor.PhaseRunning
	case corev1.PodSucceeded:
		return executor.PhaseSucceeded
	case corev1.PodFailed:
		return executor.PhaseFailed
	default: // corev1.PodUnknown (lost node) and anything newer
		return executor.PhaseUnknown
	}
}

// StuckAfter is how long a Pod may wait on one of the stuckReasons before it
// counts as failed: the Secret the Pod's envFrom names is created just after
// the Pod (CreateContainerConfigError until then), and an image pull may fail
// once on a registry blip.
const StuckAfter = 2 * time.Minute

// stuckReasons are the waiting reasons of a container that will not start by
// itself: kubelet retries them until the Pod's deadline (hours) while the job
// shows "running".
var stuckReasons = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true,
	"CreateContainerConfigError": true, "CreateContainerError": true,
	// A service's sidecar that keeps exiting, or failing its startup probe,
	// before the runner container starts (the Pod stays Pending).
	"CrashLoopBackOff": true,
}

// Stuck returns why a pending Pod will never run its job (a container
// waiting on an image that cannot be pulled, or on a configuration it cannot
// get) once it has waited StuckAfter since it was created at now; "" for a
// Pod that may still start. The reason reaches the job's log: kubelet's
// message names the image, never a credential.
func Stuck(pod *corev1.Pod, now time.Time) string {
	if pod.Status.Phase != corev1.PodPending || now.Sub(pod.CreationTimestamp.Time) < StuckAfter {
		return ""
	}
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range statuses {
			if w := cs.State.Waiting; w != nil && stuckReasons[w.Reason] {
				return fmt.Sprintf("container %s: %s: %s", cs.Name, w.Reason, w.Message)
			}
		}
	}
	return ""
}
