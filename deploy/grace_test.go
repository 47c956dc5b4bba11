package deploy

import (
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
)

// dispatchDrain is the longest dispatch serve takes to stop after SIGTERM:
// the HTTP server's grace, then the rounds in flight, each finishing the task
// it claimed (functions/dispatch: roundsGrace = 3 x dispatcher.ClaimTimeout).
const dispatchDrain = function.ShutdownGrace + 3*dispatcher.ClaimTimeout

// A dispatch Pod killed before its rounds drained reopens the window the
// detached claim closes: a task claimed in Gitea, neither stored nor
// queued, failed by the zombie reaper. Its grace period must cover the
// drain; the Kubernetes default (30 s) does not.
func TestDispatchGracePeriodCoversItsDrain(t *testing.T) {
	found := false
	for _, p := range podTemplates(t, loadManifests(t)) {
		if p.function() != "dispatch" || p.knative {
			continue
		}
		found = true
		grace := 30 * time.Second // the Kubernetes default
		if s := p.spec.TerminationGracePeriodSeconds; s != nil {
			grace = time.Duration(*s) * time.Second
		}
		if grace < dispatchDrain {
			t.Errorf("%s: terminationGracePeriodSeconds %v, want at least %v", p, grace, dispatchDrain)
		}
	}
	if !found {
		t.Fatal("no dispatch Pod template in the manifests")
	}
}
