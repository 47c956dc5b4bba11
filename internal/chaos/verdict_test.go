package chaos

import (
	"fmt"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// The verdict must see each kind of failure: a harness that cannot fail
// proves nothing. Each rule is fed records of the cases it must catch.

var t0 = time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

const (
	ok   = runnerv1.Result_RESULT_SUCCESS
	fail = runnerv1.Result_RESULT_FAILURE
)

// endpoint is the endpoint of Gitea given to the process n (a pid, unless
// a test gives two processes of one pid their own).
func endpoint(n int) string { return fmt.Sprintf("http://127.0.0.1:%d/", 40000+n) }

// A claim of task 9 (pool linux, registration 1) answered at 1 s to the
// dispatch of pid 100 on its connection 3 to its endpoint, opened at 0.5 s;
// the other pool is registration 2.
func claimed() TaskRecord {
	return TaskRecord{ID: 9, Labels: []string{"ubuntu-latest"}, Claims: 1, ClaimedAt: at(1000),
		Claim: Call{Seq: 10, Method: "FetchTask", Runner: 1, Conn: 3, ConnAt: at(500), Endpoint: endpoint(100), Started: at(990), Answered: at(1000), Task: 9}}
}

// call is a later call of pid to its endpoint.
func call(seq int64, method string, runner int64, pid, ms int) Call {
	return Call{Seq: seq, Method: method, Runner: runner, Conn: 3, ConnAt: at(500), Endpoint: endpoint(pid), Started: at(ms), Answered: at(ms + 2)}
}

func dispatchLife(pid, started, ended int, killed bool) Life {
	return Life{Kind: "dispatch", PID: pid, Started: at(started), Ended: at(ended), Killed: killed, Endpoint: endpoint(pid)}
}

// givenEndpoint is l given the endpoint of n instead of its pid's.
func givenEndpoint(l Life, n int) Life {
	l.Endpoint = endpoint(n)
	return l
}

func TestCutClaim(t *testing.T) {
	nothing := func(string) bool { return false }
	killedSoon := []Life{dispatchLife(100, 0, 1400, true), dispatchLife(101, 1600, 900000, false)}
	window := int(CutWindow / time.Millisecond)
	for _, tc := range []struct {
		name    string
		r       TaskRecord
		lives   []Life
		calls   []Call
		written func(string) bool
		want    bool
	}{
		{"killed within the window, no later call, no payload", claimed(), killedSoon, nil, nothing, true},
		{"killed at the window's end", claimed(), []Life{dispatchLife(100, 0, 1000+window, true)}, nil, nothing, true},
		{"the answer came after its process was killed", claimed(), []Life{dispatchLife(100, 0, 995, true)}, nil, nothing, true},
		// The payload write failed, Finalize (UpdateLog, UpdateTask) failed
		// too, the round went on: the process was killed minutes later.
		{"payload write and Finalize failed, dispatch killed much later", claimed(), []Life{dispatchLife(100, 0, 300000, true)},
			[]Call{call(11, "UpdateLog", 1, 100, 1100), call(14, "FetchTask", 1, 100, 1400), call(15, "UpdateTask", 1, 100, 4000)}, nothing, false},
		{"killed beyond the window, even with no later call", claimed(), []Life{dispatchLife(100, 0, 1001+window, true)}, nil, nothing, false},
		{"killed within the window after a later call for the same pool", claimed(), killedSoon,
			[]Call{call(11, "UpdateLog", 1, 100, 1100)}, nothing, false},
		{"killed within the window after its next FetchTask", claimed(), killedSoon,
			[]Call{call(12, "FetchTask", 1, 100, 1010)}, nothing, false},
		// dispatch runs the pools' rounds concurrently.
		{"a later call for another pool is no evidence", claimed(), killedSoon,
			[]Call{call(11, "FetchTask", 2, 100, 1100), call(12, "UpdateTask", 2, 100, 1200)}, nothing, true},
		// Readiness declares the first pool outside the rounds.
		{"a later Declare is no evidence", claimed(), killedSoon, []Call{call(11, "Declare", 1, 100, 1100)}, nothing, true},
		{"a later call of another process is no evidence", claimed(), killedSoon,
			[]Call{call(11, "FetchTask", 1, 101, 1700)}, nothing, true},
		{"a call before the claim is no evidence", claimed(), killedSoon, []Call{call(9, "FetchTask", 1, 100, 700)}, nothing, true},
		{"the same PID again in a later process is no evidence",
			claimed(), []Life{dispatchLife(100, 0, 1400, true), givenEndpoint(dispatchLife(100, 2000, 9000, false), 1000)},
			[]Call{{Seq: 20, Method: "FetchTask", Runner: 1, Conn: 7, ConnAt: at(2100), Endpoint: endpoint(1000), Started: at(2100)}}, nothing, true},
		{"its payload was written", claimed(), killedSoon, nil, func(id string) bool { return id == "linux-9" }, false},
		{"its dispatch was not killed", claimed(), []Life{dispatchLife(100, 0, 1400, false)}, nil, nothing, false},
		{"answered on the endpoint every process shares", func() TaskRecord { r := claimed(); r.Claim.Endpoint = ""; return r }(), killedSoon, nil, nothing, false},
		{"answered to a process that is no dispatch", claimed(), []Life{dispatchLife(101, 0, 1400, true)}, nil, nothing, false},
		{"its endpoint was a later process's of the same PID, killed beyond the window",
			claimed(), []Life{givenEndpoint(dispatchLife(100, 0, 400, true), 1000), dispatchLife(100, 450, 600000, true)}, nil, nothing, false},
		{"never claimed", TaskRecord{ID: 9, Labels: []string{"ubuntu-latest"}}, killedSoon, nil, nothing, false},
		// A busy machine: Gitea accepted the connection, and answered the
		// claim, only after the dispatch that opened it was killed and reaped.
		{"its connection accepted after its dispatch was reaped", func() TaskRecord {
			r := claimed()
			r.Claim.ConnAt, r.Claim.Started, r.Claim.Answered = at(1500), at(1510), at(1511)
			return r
		}(), killedSoon, nil, nothing, true},
	} {
		got, why := cutClaim(tc.r, ClaimEvidence{Dispatches: tc.lives, Calls: tc.calls, Written: tc.written})
		if got != tc.want {
			t.Errorf("%s: cutClaim = %v (%s), want %v", tc.name, got, why, tc.want)
		}
	}
}

// Payload records (PayloadGone): stored throughout, removed at ms, never
// written.
var (
	stored       PayloadGone = func(string) (time.Time, bool) { return time.Time{}, false }
	neverWritten PayloadGone = func(string) (time.Time, bool) { return time.Time{}, true }
)

func removedAt(ms int) PayloadGone { return func(string) (time.Time, bool) { return at(ms), true } }

func TestJudgeFinal(t *testing.T) {
	reason := "gitea-dynamic-runner: the executor ended (Failed) without reporting a result; the job is marked failed"
	exec := func(end ExecEnd, endedMs int) ExecRecord {
		return ExecRecord{Sandbox: "sb", Assignment: "linux-9", Task: 9, Created: at(1100), Started: at(1500), End: end, EndedAt: at(endedMs)}
	}
	reported := func(result, answer runnerv1.Result, sentMs int) ExecRecord {
		e := exec(ExecReported, sentMs+1)
		e.Result, e.Answer, e.SentAt = result, answer, at(sentMs)
		return e
	}
	recovered := Final{Result: fail, Accepted: true, By: "protocol", Log: reason, At: at(5000), Endpoint: endpoint(300)}
	// refused is an executor whose fetch the gateway refused at refusedMs
	// (0: it never fetched), ending it at endedMs.
	refused := func(refusedMs, endedMs int) ExecRecord {
		e := exec(ExecNoTask, endedMs)
		e.Started, e.Refusal = time.Time{}, "not_found: task 9 is over or unknown"
		if refusedMs > 0 {
			e.RefusedAt = at(refusedMs)
		}
		return e
	}
	for _, tc := range []struct {
		name  string
		final Final
		execs []ExecRecord
		gone  PayloadGone // nil: removed at 4000, once its executor ended
		want  Verdict
	}{
		{"the executor reported success and Gitea holds it",
			Final{Result: ok, Accepted: true, By: "runner", At: at(4000)}, []ExecRecord{reported(ok, ok, 4000)}, nil, Fine},
		{"the executor reported failure and Gitea holds it",
			Final{Result: fail, Accepted: true, By: "runner", At: at(4000)}, []ExecRecord{reported(fail, fail, 4000)}, nil, Fine},
		// Transport-independent: a report that reached Gitea over the
		// protocol (the gateway) while the executor waited for its answer.
		{"the executor's report, forwarded over the protocol",
			Final{Result: ok, Accepted: true, By: "protocol", At: at(4001)}, []ExecRecord{reported(ok, ok, 4000)}, nil, Fine},
		{"a healthy executor's success overwritten by our failure", recovered, []ExecRecord{reported(ok, fail, 6000)}, nil, WronglyFailed},
		{"a healthy executor's failure preceded by ours", recovered, []ExecRecord{reported(fail, fail, 6000)}, nil, WronglyFailed},
		{"the executor stopped before any final result, then failed by recover", recovered, []ExecRecord{exec(ExecStopped, 4500)}, nil, WronglyFailed},
		{"the executor was running when recover failed the task (it saw the result on its heartbeat)",
			recovered, []ExecRecord{exec(ExecCancelled, 5800)}, nil, WronglyFailed},
		{"the executor was still running at the run's end", recovered, []ExecRecord{exec(ExecAbandoned, 90000)}, nil, WronglyFailed},
		{"the executor ended without reporting, then failed by recover with a reason", recovered, []ExecRecord{exec(ExecUnreported, 4500)}, nil, Fine},
		// Refused by the gateway: excused only by the payload's removal or
		// the task's final result before the refusal began.
		{"refused after its payload was removed, then failed by recover with a reason",
			recovered, []ExecRecord{refused(4400, 4500)}, removedAt(4000), Fine},
		{"refused, its payload never written, then failed by recover with a reason",
			recovered, []ExecRecord{refused(1500, 1600)}, neverWritten, Fine},
		{"a late duplicate refused after the task's final result", recovered,
			[]ExecRecord{exec(ExecUnreported, 4500), func() ExecRecord { e := refused(7100, 7200); e.Sandbox, e.Created = "sb2", at(7000); return e }()},
			stored, Fine},
		{"refused while its payload was stored and the task ran (a gateway refusing a runnable task)",
			recovered, []ExecRecord{refused(1500, 1600)}, stored, WronglyFailed},
		{"refused as its payload was being removed (removed after the refusal began)",
			recovered, []ExecRecord{refused(4400, 4500)}, removedAt(4450), WronglyFailed},
		{"a gateway that never answered its fetches for a minute while the task was runnable",
			Final{Result: fail, Accepted: true, By: "protocol", Log: reason, At: at(62000)}, []ExecRecord{refused(1500, 61600)}, stored, WronglyFailed},
		{"its sandbox's variables unusable (it never fetched) while the task was runnable",
			recovered, []ExecRecord{refused(0, 1200)}, stored, WronglyFailed},
		{"no executor was created; dispatch's Finalize with a reason",
			Final{Result: fail, Accepted: true, By: "protocol", Log: "gitea-dynamic-runner could not store the task for an executor; run the job again", At: at(1200)},
			nil, nil, Fine},
		{"a second executor created after the final result (a late duplicate), stopped",
			recovered, []ExecRecord{exec(ExecUnreported, 4500), {Sandbox: "sb2", Task: 9, Created: at(7000), End: ExecStopped, EndedAt: at(8000)}}, nil, Fine},
		// Chosen: lost, not wrongly-failed: nothing shows the executor was
		// healthy, but the job ended failed with no word why.
		{"a failure without a reason", Final{Result: fail, Accepted: true, By: "protocol", At: at(5000)},
			[]ExecRecord{exec(ExecUnreported, 4500)}, nil, Lost},
		{"a success no executor reported", Final{Result: ok, Accepted: true, By: "protocol", Log: "done", At: at(5000)},
			[]ExecRecord{exec(ExecUnreported, 4500)}, nil, Lost},
		{"a runner's final result no executor records", Final{Result: ok, Accepted: true, By: "runner", At: at(5000)}, nil, nil, Lost},
	} {
		gone := tc.gone
		if gone == nil {
			gone = removedAt(4000)
		}
		if got, why := judgeFinal(tc.final, tc.execs, gone); got != tc.want {
			t.Errorf("%s: judgeFinal = %s (%s), want %s", tc.name, got, why, tc.want)
		}
	}
}

func TestJudge(t *testing.T) {
	reason := "gitea-dynamic-runner: the executor ended (Failed) without reporting a result; the job is marked failed"
	// Dispatches SIGKILLed at 1.4 s: pid 100 claimed task 1 for one pool
	// and task 2 for the other, concurrently; pid 110 claimed task 3, whose
	// payload was written; pid 120 claimed task 4 and called Gitea again for
	// its pool (Finalize's UpdateLog). The dispatch of pid 200 claimed task
	// 5, its payload write and Finalize failed, and it was killed five
	// minutes later.
	claim := func(id int64, seq int64, pid int) TaskRecord {
		r := claimed()
		r.ID, r.Claim.Seq, r.Claim.Endpoint, r.Claim.Task = id, seq, endpoint(pid), id
		return r
	}
	otherPool := func(r TaskRecord) TaskRecord {
		r.Labels, r.Claim.Runner = []string{"ubuntu-latest-arm"}, 2
		return r
	}
	reaped := func(r TaskRecord) TaskRecord {
		r.Result, r.Reaped = fail, true
		r.Finals = []Final{{Result: fail, Accepted: true, By: "reaper", At: at(31000)}}
		return r
	}
	evidence := ClaimEvidence{
		Dispatches: []Life{dispatchLife(100, 0, 1400, true), dispatchLife(110, 0, 1400, true), dispatchLife(120, 0, 1400, true),
			dispatchLife(200, 0, 300000, true)},
		Calls:   []Call{call(41, "UpdateLog", 1, 120, 1100), call(51, "UpdateLog", 1, 200, 1100), call(52, "FetchTask", 1, 200, 1500)},
		Written: func(id string) bool { return id == "linux-3" },
	}
	cut := func(r TaskRecord) (bool, string) { return cutClaim(r, evidence) }
	done := func(id int64, fs ...Final) TaskRecord {
		r := claim(id, id*10, 300)
		r.Finals = fs
		for _, f := range fs {
			if f.Accepted {
				r.Result = f.Result
			}
		}
		return r
	}
	records := []TaskRecord{
		claim(1, 10, 100),                    // no final result, cut
		reaped(otherPool(claim(2, 20, 100))), // reaped, cut
		reaped(claim(3, 30, 110)),            // its payload was written: lost
		reaped(claim(4, 40, 120)),            // a later call of its pool: lost
		reaped(claim(5, 50, 200)),            // payload write and Finalize failed, killed much later: lost
		done(6, Final{Result: ok, Accepted: true, By: "runner", At: at(4000)}),
		done(7, Final{Result: fail, Accepted: true, By: "protocol", Log: reason, At: at(5000)}, Final{Result: ok, By: "runner", At: at(6000)}),
		done(8, Final{Result: fail, Accepted: true, By: "protocol", Log: reason, At: at(5000)}),
		done(9, Final{Result: fail, Accepted: true, By: "protocol", At: at(5000)}),
		// The same result again is harmless (a retried report); a differing
		// one sent to a finished task is not.
		done(10, Final{Result: ok, Accepted: true, By: "runner", At: at(4000)}, Final{Result: ok, By: "protocol", At: at(4500)}),
		done(11, Final{Result: ok, Accepted: true, By: "runner", At: at(4000)}, Final{Result: fail, By: "protocol", Log: reason, At: at(4500)}),
		func() TaskRecord {
			r := done(12, Final{Result: ok, Accepted: true, By: "runner", At: at(4000)})
			r.Claims = 2
			return r
		}(),
		{ID: 13, Labels: []string{"ubuntu-latest"}}, // never claimed
	}
	execs := []ExecRecord{
		{Sandbox: "s6", Task: 6, Created: at(1100), Started: at(1500), End: ExecReported, Result: ok, Answer: ok, SentAt: at(4000), EndedAt: at(4001)},
		{Sandbox: "s7", Task: 7, Created: at(1100), Started: at(1500), End: ExecReported, Result: ok, Answer: fail, SentAt: at(6000), EndedAt: at(6001)},
		{Sandbox: "s8", Task: 8, Created: at(1100), Started: at(1500), End: ExecStopped, EndedAt: at(4900)},
		{Sandbox: "s9", Task: 9, Created: at(1100), Started: at(1500), End: ExecUnreported, EndedAt: at(4900)},
		{Sandbox: "s10", Task: 10, Created: at(1100), Started: at(1500), End: ExecReported, Result: ok, Answer: ok, SentAt: at(4000), EndedAt: at(4001)},
		{Sandbox: "s11", Task: 11, Created: at(1100), Started: at(1500), End: ExecReported, Result: ok, Answer: ok, SentAt: at(4000), EndedAt: at(4001)},
		{Sandbox: "s12", Task: 12, Created: at(1100), Started: at(1500), End: ExecReported, Result: ok, Answer: ok, SentAt: at(4000), EndedAt: at(4001)},
	}
	want := map[int64]Verdict{1: Cut, 2: Cut, 3: Lost, 4: Lost, 5: Lost, 6: Fine, 7: WronglyFailed, 8: WronglyFailed, 9: Lost,
		10: Fine, 11: Lost, 12: Lost, 13: Lost}
	byTask := map[int64][]ExecRecord{}
	for _, e := range execs {
		byTask[e.Task] = append(byTask[e.Task], e)
	}
	for _, r := range records {
		if got, why := judgeTask(r, byTask[r.ID], cut, removedAt(4000)); got != want[r.ID] {
			t.Errorf("task %d: judgeTask = %s (%s), want %s", r.ID, got, why, want[r.ID])
		}
	}
	// One task queued that Gitea does not hold is lost too.
	tally := judge(records, len(records)+1, execs, cut, removedAt(4000))
	if tally.Lost != 8 || tally.Cut != 2 || tally.WronglyFailed != 2 || len(tally.Lines) != 12 {
		t.Errorf("judge = %d lost, %d cut, %d wrongly-failed, lines %q; want 8, 2, 2 and 12 lines (one for the missing task)",
			tally.Lost, tally.Cut, tally.WronglyFailed, tally.Lines)
	}
	if tally.OwnReports != 4 { // tasks 6, 10, 11 and 12
		t.Errorf("judge counted %d tasks ended by their executor's own report, want 4", tally.OwnReports)
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

// A gateway that refuses every executor: each executor's fetch is refused
// while its payload is stored and its task runs, so it ends without its task,
// and recover fails each task with a reason. The verdict must fail the run:
// every task wrongly-failed, and no task ended by its executor's own report.
func TestJudgeRefusingGateway(t *testing.T) {
	reason := "gitea-dynamic-runner: the executor ended (Failed) without reporting a result; the job is marked failed"
	const n = 60
	var records []TaskRecord
	var execs []ExecRecord
	for id := int64(1); id <= n; id++ {
		r := claimed()
		r.ID, r.Claim.Task, r.Claim.Seq = id, id, id*10
		r.Result = fail
		r.Finals = []Final{{Result: fail, Accepted: true, By: "protocol", Log: reason, At: at(5000), Endpoint: endpoint(300)}}
		records = append(records, r)
		execs = append(execs, ExecRecord{Sandbox: fmt.Sprintf("s%d", id), Assignment: fmt.Sprintf("linux-%d", id), Task: id,
			Created: at(1100), End: ExecNoTask, EndedAt: at(1600), RefusedAt: at(1500), Refusal: "permission_denied: refused"})
	}
	// recover removes each payload once it has failed the task.
	tally := judge(records, n, execs, func(TaskRecord) (bool, string) { return false, "" }, removedAt(5100))
	if tally.WronglyFailed != n || tally.Lost != 0 {
		t.Errorf("judge over a gateway that refused all %d executors = %d lost, %d wrongly-failed; want %d wrongly-failed",
			n, tally.Lost, tally.WronglyFailed, n)
	}
	if tally.OwnReports != 0 {
		t.Errorf("own reports = %d, want 0", tally.OwnReports)
	}
	if ok, line := ownShare(tally.OwnReports, n); ok {
		t.Errorf("ownShare(%d, %d) = ok (%s), want a failure", tally.OwnReports, n, line)
	}
}

func TestOwnShare(t *testing.T) {
	for _, tc := range []struct {
		own, n int
		ok     bool
	}{
		{57, 60, true},    // a short run's measure
		{909, 1000, true}, // a full run's
		{45, 60, true},    // 75%: the floor
		{44, 60, false},
		{0, 1000, false},
		{0, MinTasksForShare - 1, true}, // too few tasks to judge by a share
		{0, 0, true},
	} {
		if ok, line := ownShare(tc.own, tc.n); ok != tc.ok {
			t.Errorf("ownShare(%d, %d) = %v (%s), want %v", tc.own, tc.n, ok, line, tc.ok)
		}
	}
}
