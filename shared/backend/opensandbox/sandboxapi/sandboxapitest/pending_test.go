package sandboxapitest

import (
	"net/http"
	"testing"
)

// TestPendingAnswers: the answers a case polls on past its event are exactly the real server's
// transitional ones (each seen on a run), on the runtime and after the event that shows them;
// any other answer is judged at once.
func TestPendingAnswers(t *testing.T) {
	running := contractAnswer{Status: http.StatusOK, State: "Running", Reason: "CONTAINER_RUNNING"}
	creating := contractAnswer{Status: http.StatusOK, State: "Pending", Reason: "CREATING"}
	for _, c := range []struct {
		name    string
		runtime Runtime
		event   contractEvent
		answer  contractAnswer
		pending bool
	}{
		{"running before an expiry", Docker, eventExpire, running, true},
		{"killed at expiry, Docker", Docker, eventExpire, dockerKilledAtExpiry, true},
		{"removing after expiry, Docker", Docker, eventExpire, dockerRemovingAtExpiry, true},
		{"removing after expiry, Kubernetes", Kubernetes, eventExpire, dockerRemovingAtExpiry, false},
		{"removing after an exit", Docker, eventExit, dockerRemovingAtExpiry, false},
		{"another unknown state", Docker, eventExpire, contractAnswer{Status: http.StatusOK, State: "Unknown", Reason: "CONTAINER_STATE_UNKNOWN", Message: "Sandbox container is in state 'dead'."}, false},
		{"gone", Docker, eventExpire, contractAnswer{Status: http.StatusNotFound}, false},
		{"restarting after an exit, Kubernetes", Kubernetes, eventExit, creating, true},
		{"restarting after an exit, Docker", Docker, eventExit, creating, false},
	} {
		r := &contractRun{target: Target{Runtime: c.runtime}, tc: contractCase{event: c.event}}
		if got := r.pending(c.answer); got != c.pending {
			t.Errorf("%s: pending %v, want %v", c.name, got, c.pending)
		}
	}
}
