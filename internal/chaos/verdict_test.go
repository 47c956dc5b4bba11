package chaos

import (
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// The verdict must see each kind of failure: a harness that cannot fail
// proves nothing.
func TestLostTasks(t *testing.T) {
	ok, fail := runnerv1.Result_RESULT_SUCCESS, runnerv1.Result_RESULT_FAILURE
	records := []TaskRecord{
		{ID: 1, Claims: 1, Result: ok, Finals: []Final{{Result: ok, Accepted: true, By: "runner"}}},
		// The same result again is harmless (a retried report).
		{ID: 2, Claims: 1, Result: ok, Finals: []Final{{Result: ok, Accepted: true, By: "runner"}, {Result: ok, By: "protocol"}}},
		{ID: 3, Claims: 0}, // never claimed
		{ID: 4, Claims: 1}, // claimed, never ended
		{ID: 5, Claims: 1, Result: fail, Reaped: true, Finals: []Final{{Result: fail, Accepted: true, By: "reaper"}}},
		{ID: 6, Claims: 1, Result: ok, Finals: []Final{{Result: ok, Accepted: true, By: "runner"}, {Result: fail, By: "protocol"}}},
		{ID: 7, Claims: 2, Result: ok, Finals: []Final{{Result: ok, Accepted: true, By: "runner"}}},
	}
	never := func(TaskRecord) bool { return false }
	lost, cut, lines := lostTasks(records, 8, never) // and one queued task Gitea does not hold
	if lost != 5 || cut != 0 || len(lines) != 6 {
		t.Errorf("lostTasks = %d, %d, %q; want 5 tasks, none cut, and 6 lines", lost, cut, lines)
	}
	// A cut claim excuses a task that only never ended or was reaped, never
	// one claimed twice or sent a differing result.
	always := func(TaskRecord) bool { return true }
	lost, cut, lines = lostTasks(records, 7, always)
	if lost != 3 || cut != 2 || len(lines) != 5 {
		t.Errorf("lostTasks with every claim cut = %d, %d, %q; want tasks 3, 6 and 7 lost, 4 and 5 cut", lost, cut, lines)
	}
}

func TestCutClaim(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lives := []Life{
		{Kind: "dispatch", Started: at(0), Ended: at(1000), Killed: true},
		{Kind: "dispatch", Started: at(1200), Ended: at(5000), Killed: false},
	}
	record := func(requested int) TaskRecord {
		return TaskRecord{ID: 9, Labels: []string{"ubuntu-latest"}, Claims: 1, RequestedAt: at(requested), ClaimedAt: at(requested + 5)}
	}
	nothing := func(string) bool { return false }
	for _, tc := range []struct {
		name    string
		r       TaskRecord
		written func(string) bool
		want    bool
	}{
		{"claimed by the killed process, nothing written", record(900), nothing, true},
		{"its payload was written", record(900), func(id string) bool { return id == "linux-9" }, false},
		{"claimed by a process that was not killed", record(2000), nothing, false},
		// The request's handler started after its sender was killed (real Gitea
		// finishes a claim whose client hung up): still the killed process's.
		{"request handled after its sender died", record(1100), nothing, true},
		{"requested before any dispatch ran", record(-100), nothing, false},
		{"never claimed", TaskRecord{ID: 9, Labels: []string{"ubuntu-latest"}}, nothing, false},
	} {
		if got := cutClaim(tc.r, lives, tc.written); got != tc.want {
			t.Errorf("%s: cutClaim = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDuplicated(t *testing.T) {
	keys, err := taskassignment.NewKeys("gitea-dynamic-runner.io")
	if err != nil {
		t.Fatal(err)
	}
	sb := func(id, aid string) sandboxapitest.Sandbox {
		return sandboxapitest.Sandbox{ID: id, Metadata: map[string]string{keys.AssignmentID: aid}}
	}
	n, lines := duplicated([]sandboxapitest.Sandbox{sb("a", "linux-1"), sb("b", "linux-2"), sb("c", "linux-1")}, keys)
	if n != 1 || len(lines) != 1 {
		t.Errorf("duplicated = %d, %q; want linux-1 only", n, lines)
	}
}
