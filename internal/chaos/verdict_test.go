package chaos

import (
	"testing"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/opensandbox/opensandboxtest"
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
	lost, lines := lostTasks(records, 8) // and one queued task Gitea does not hold
	if lost != 5 || len(lines) != 6 {
		t.Errorf("lostTasks = %d, %q; want 5 tasks and 6 lines", lost, lines)
	}
}

func TestDuplicated(t *testing.T) {
	keys, err := taskassignment.NewKeys("gitea-dynamic-runner.io")
	if err != nil {
		t.Fatal(err)
	}
	sb := func(id, aid string) opensandboxtest.Sandbox {
		return opensandboxtest.Sandbox{ID: id, Metadata: map[string]string{keys.AssignmentID: aid}}
	}
	n, lines := duplicated([]opensandboxtest.Sandbox{sb("a", "linux-1"), sb("b", "linux-2"), sb("c", "linux-1")}, keys)
	if n != 1 || len(lines) != 1 {
		t.Errorf("duplicated = %d, %q; want linux-1 only", n, lines)
	}
}
