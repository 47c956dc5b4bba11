package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
)

// The verdict's rules over the run's records, pure functions so that each can
// be fed the case it must catch (verdict_test.go). Every task Gitea holds is
// judged once, in this order:
//
//  1. lost: claimed other than once; or never given a final result, or
//     reaped as a zombie, unless its claim was cut (cutClaim);
//  2. wrongly-failed: its accepted final result is not its executor's own
//     report, and an executor of it reported, or was stopped (its sandbox
//     removed) before the task had any final result, or was alive when the
//     final result came, or ended without its task (refused by the gateway)
//     while its payload was stored and the task had no final result
//     (judgeFinal);
//  3. lost: its accepted final result is neither its executor's report nor
//     a FAILURE with a reason (a log row) for a task no executor reported
//     on; or another final result differing from the accepted one was sent
//     by anyone but the reaper (judgeFinal, judgeTask);
//  4. fine otherwise.
//
// A cut claim is printed apart and is no failure; lost and wrongly-failed
// tasks fail the run, and so does a run of at least MinTasksForShare tasks
// of which fewer than MinOwnShare ended by their executor's own report
// (ownShare).

// MinOwnShare is the least share of a run's tasks that must end by their
// executor's own report (its final result, through the gateway). The run's
// executors end without reporting a tenth of the time (Executors.Unreported,
// 0.1), and recover fails those tasks; a few more end by a cut claim or a
// sandbox stopped by a backend fault. Measured: 896 to 909 of 1,000 tasks
// in full runs, 52 to 57 of 60 in short ones (docs/BENCHMARKS.md). Below
// 75% the run fails: with a tenth unreported, 16 or more of 60 tasks
// unreported has a chance of 2e-4 (binomial), 251 or more of 1,000 of
// 1e-42, so a run under the floor means the product failed tasks its
// executors could have reported on (a gateway refusing them, reports lost),
// even those the rules per task cannot pin on one executor.
const MinOwnShare = 0.75

// MinTasksForShare is the least number of tasks for which MinOwnShare is
// checked: with 50 tasks the chance of falling under it by the unreported
// tenth alone is 1e-3 (13 or more unreported); with fewer, a share says
// little.
const MinTasksForShare = 50

// ownShare checks the tasks ended by their executor's own report (own) of a
// run of n tasks against MinOwnShare; the string says the share either way.
func ownShare(own, n int) (bool, string) {
	if n == 0 {
		return true, "no tasks"
	}
	share := float64(own) / float64(n)
	line := fmt.Sprintf("%d of %d tasks (%.1f%%) ended by their executor's own report", own, n, 100*share)
	if n < MinTasksForShare {
		return true, line + fmt.Sprintf(" (not checked under %d tasks)", MinTasksForShare)
	}
	if share < MinOwnShare {
		return false, line + fmt.Sprintf(", under the floor of %.0f%%", 100*MinOwnShare)
	}
	return true, line
}

// PayloadGone says since when the payload of an assignment is not stored:
// the time of the delete or purge marker its key holds last (gone true), the
// zero time if it was never written (gone true), or gone false while the
// payload is stored.
type PayloadGone func(assignmentID string) (since time.Time, gone bool)

// CutWindow bounds how long after Gitea's FetchTask answer a dispatch may
// legitimately hold the claimed task in memory only, with no payload written
// and no further call to Gitea for the task's pool. From the dispatcher's
// code (shared/dispatcher): the FetchTask runs on a context detached from
// the caller's that ends dispatcher.ClaimTimeout (30 s) after the request
// was sent (fetch, detached), so the answer reaches dispatch within
// ClaimTimeout of being written; building the assignment does no I/O; the
// payload put then runs on a fresh ClaimTimeout (queue). When the put ends,
// either the payload is written or Finalize starts with a call to Gitea
// for the same pool (UpdateLog), and any later work of the round (the next
// FetchTask, the keep-alives) is such a call too. So a dispatch SIGKILLed
// more than 2 x ClaimTimeout after the answer had either written the
// payload or called Gitea again for the pool: it is no longer in the
// window Gitea's runner protocol leaves (see cutClaim).
const CutWindow = 2 * dispatcher.ClaimTimeout

// Verdict is what the verdict says of one task.
type Verdict int

const (
	Fine Verdict = iota
	Cut
	Lost
	WronglyFailed
)

func (v Verdict) String() string {
	return [...]string{"FINE", "CUT", "LOST", "WRONGLY-FAILED"}[v]
}

// Tally is the verdict over all tasks: counts by verdict, and a line for
// every task that is not fine; OwnReports counts the tasks whose accepted
// final result is their executor's own report.
type Tally struct {
	Lost, Cut, WronglyFailed int
	OwnReports               int
	Lines                    []string
}

// ClaimEvidence is what cutClaim judges a claim from.
type ClaimEvidence struct {
	// Dispatches are the dispatch processes of the run (Fleet.Lives).
	Dispatches []Life
	// Calls are all calls Gitea answered (Gitea.CallLog).
	Calls []Call
	// Written reports whether a payload was ever written under an
	// assignment ID (a deleted or purged payload leaves a marker).
	Written func(assignmentID string) bool
}

// cutClaim reports whether the claim of r (a task claimed once that never
// got a final result of its own, or was reaped) was cut by a SIGKILL in the
// one window the runner protocol leaves: the FetchTask answer carrying the
// task came on a connection to the endpoint given to one dispatch process
// alone (Call.Endpoint, Life.Endpoint: known from the address the
// connection came to, however late Gitea accepted it), that process ended
// by the harness's SIGKILL at most CutWindow after the answer was written
// (or before it: an answer written to a process already gone), it made no
// later call for the task's pool, and no payload of the task was ever
// written. The second string says why, either way.
//
// "No later call" counts the calls to the same endpoint with the same
// registration (Call.Runner: each pool registers its own runner) whose
// handlers started after the claim's: dispatch runs the rounds of different
// pools concurrently (dispatcher.Rounds, one goroutine per pool), so a call
// for another pool says nothing of this claim, but it serializes the calls
// of one pool (Rounds runs one round of a pool at a time and Dispatcher
// locks per pool; a round's claims run one after the other), so a later call
// of the same pool comes after queue returned for this claim: the payload
// put ended, and either the payload was written or Finalize was tried. A
// Declare is left out: readiness (giteaCheck) sends one for the first pool
// outside the rounds, at any time.
func cutClaim(r TaskRecord, ev ClaimEvidence) (bool, string) {
	c := r.Claim
	if c.Seq == 0 || c.Answered.IsZero() {
		return false, "no answer of its claim was recorded"
	}
	for _, pool := range poolsOf(r.Labels) {
		if ev.Written(fmt.Sprintf("%s-%d", pool, r.ID)) {
			return false, "its payload was written"
		}
	}
	if c.Endpoint == "" {
		return false, fmt.Sprintf("its claim (connection %d) came to no process's own endpoint", c.Conn)
	}
	i := slices.IndexFunc(ev.Dispatches, func(l Life) bool { return l.Endpoint == c.Endpoint })
	if i < 0 {
		return false, fmt.Sprintf("its claim came to %s, no dispatch's endpoint", c.Endpoint)
	}
	life := ev.Dispatches[i]
	if !life.Killed {
		return false, fmt.Sprintf("its claim was answered to dispatch pid %d, which was not SIGKILLed", life.PID)
	}
	if after := life.Ended.Sub(c.Answered); after > CutWindow {
		return false, fmt.Sprintf("dispatch pid %d was SIGKILLed %s after its claim's answer, beyond the window of %s",
			life.PID, after.Round(time.Millisecond), CutWindow)
	}
	for _, l := range ev.Calls {
		if l.Seq > c.Seq && l.Endpoint == c.Endpoint && l.Runner == c.Runner && l.Method != "Declare" {
			return false, fmt.Sprintf("dispatch pid %d called %s for the same pool at %s, after its claim's answer at %s",
				life.PID, l.Method, clock(l.Started), clock(c.Answered))
		}
	}
	return true, fmt.Sprintf("its claim was answered at %s to dispatch pid %d, SIGKILLed %s later with no later call for the pool and no payload written",
		clock(c.Answered), life.PID, life.Ended.Sub(c.Answered).Round(time.Millisecond))
}

// accepted returns r's accepted final result: the first one, which Gitea
// keeps.
func accepted(r TaskRecord) (Final, bool) {
	i := slices.IndexFunc(r.Finals, func(f Final) bool { return f.Accepted })
	if i < 0 {
		return Final{}, false
	}
	return r.Finals[i], true
}

// reportOf returns the executor whose own report f is: it reported f's
// result, and Gitea took f while that report was on its way (between the
// executor sending it and the answer coming back), whatever carried it.
func reportOf(f Final, execs []ExecRecord) (ExecRecord, bool) {
	for _, e := range execs {
		if e.End == ExecReported && e.Result == f.Result && !f.At.Before(e.SentAt) && !f.At.After(e.EndedAt) {
			return e, true
		}
	}
	return ExecRecord{}, false
}

// judgeFinal checks the accepted final result f of a task against what its
// executors (execs: every executor created for it) did. f is fine when it is
// an executor's own report. Else it was set by us (recover's report,
// dispatch's Finalize) and the task is wrongly-failed if any executor of it
// was healthy: it reported (its result lost to ours), or it was stopped (its
// sandbox removed) before the task had any final result, or it was alive
// (created and not ended) when f came, or it ended without its task
// (ExecNoTask: the gateway refused it or never answered) while the task was
// still to run: its payload stored (gone) and f not yet come at the moment
// the refusal began (ExecRecord.RefusedAt). Only those two facts, each
// from a record the gateway does not write, excuse a refusal: a gateway
// that refuses a runnable task fails a healthy executor whatever it says,
// and a refusal whose moment overlaps the payload's removal or f (a
// removal or f after RefusedAt) is counted. The rule of the live executor
// is stricter than
// "stopped after the task had a final result is fine": in this run nobody
// cancels a task, so a final result of ours that lands while an executor
// lives failed a running job; a job cancelled in Gitea would come with no
// final result of ours. Otherwise no executor ever reported (none was
// created, or each ended without reporting before f, or without its task
// once its payload was gone or f had come)
// and f must be a FAILURE with a reason (a log row written before it); any
// other result, or a failure with no reason, is lost: the job's outcome is
// unaccounted for (nothing shows an executor was healthy, so it is not
// counted wrongly-failed).
func judgeFinal(f Final, execs []ExecRecord, gone PayloadGone) (Verdict, string) {
	if e, ok := reportOf(f, execs); ok {
		return Fine, "its executor's report (" + e.Sandbox + ")"
	}
	by := f.By
	if f.Endpoint != "" {
		by += " (via " + f.Endpoint + ")"
	}
	ours := fmt.Sprintf("%s by %s at %s", name(f.Result), by, clock(f.At))
	if f.By == "runner" {
		return Lost, "a final result " + ours + " that no executor's record reports"
	}
	for _, e := range execs {
		switch {
		case e.End == ExecReported:
			return WronglyFailed, fmt.Sprintf("executor %s reported %s at %s (answered %s), but Gitea holds %s",
				e.Sandbox, name(e.Result), clock(e.SentAt), name(e.Answer), ours)
		case e.End == ExecStopped && e.EndedAt.Before(f.At):
			return WronglyFailed, fmt.Sprintf("executor %s was stopped (its sandbox removed at %s) before the task had a final result, then Gitea got %s",
				e.Sandbox, clock(e.EndedAt), ours)
		case !e.Created.After(f.At) && (e.End == ExecRunning || e.End == ExecAbandoned || e.EndedAt.After(f.At)):
			end := "ran on"
			if e.End != ExecRunning {
				end = fmt.Sprintf("ended %s at %s", e.End, clock(e.EndedAt))
			}
			return WronglyFailed, fmt.Sprintf("executor %s (created %s) was alive when Gitea got %s; it %s",
				e.Sandbox, clock(e.Created), ours, end)
		case e.End == ExecNoTask && runnableAt(e, f, gone):
			return WronglyFailed, fmt.Sprintf("executor %s was refused its task at %s (%s) while its payload was stored and the task had no final result; then Gitea got %s",
				e.Sandbox, clock(refusedAt(e)), e.Refusal, ours)
		}
	}
	if f.Result != runnerv1.Result_RESULT_FAILURE {
		return Lost, fmt.Sprintf("a final result %s that no executor reported", ours)
	}
	if f.Log == "" {
		return Lost, fmt.Sprintf("a final result %s with no reason (no log row)", ours)
	}
	return Fine, fmt.Sprintf("%s: %q", ours, f.Log)
}

// refusedAt is when e's refusal began: RefusedAt, or EndedAt if it never
// fetched.
func refusedAt(e ExecRecord) time.Time {
	if e.RefusedAt.IsZero() {
		return e.EndedAt
	}
	return e.RefusedAt
}

// runnableAt reports whether e's task was still to run when e's refusal
// began: f (the task's first final result) came after it, and the payload
// of e's assignment was stored then (written, and not removed until after).
func runnableAt(e ExecRecord, f Final, gone PayloadGone) bool {
	at := refusedAt(e)
	if !f.At.After(at) {
		return false
	}
	since, isGone := gone(e.Assignment)
	return !isGone || since.After(at)
}

// judgeTask judges one task from Gitea's record of it, its executors'
// records, cut (cutClaim over the run's evidence) and gone (the payloads'
// removal).
func judgeTask(r TaskRecord, execs []ExecRecord, cut func(TaskRecord) (bool, string), gone PayloadGone) (Verdict, string) {
	var differing []string
	for _, f := range r.Finals {
		if !f.Accepted && f.Result != r.Result && f.By != "reaper" {
			differing = append(differing, fmt.Sprintf("another final result %s by %s", name(f.Result), f.By))
		}
	}
	if r.Claims != 1 {
		return Lost, fmt.Sprintf("claimed %d times", r.Claims)
	}
	f, ok := accepted(r)
	if !ok || r.Reaped {
		why := "no final result"
		if r.Reaped {
			why = "reaped as a zombie"
		}
		if len(differing) == 0 {
			isCut, because := cut(r)
			if isCut {
				return Cut, why + ": " + because
			}
			return Lost, why + "; not a cut claim: " + because
		}
		return Lost, why + ", " + strings.Join(differing, ", ")
	}
	v, why := judgeFinal(f, execs, gone)
	if v == Fine && len(differing) > 0 {
		return Lost, strings.Join(differing, ", ")
	}
	return v, why
}

// judge judges every task: records are Gitea's (n were queued), execs every
// executor's, cut and gone as judgeTask's; it counts the tasks ended by
// their executor's own report too.
func judge(records []TaskRecord, n int, execs []ExecRecord, cut func(TaskRecord) (bool, string), gone PayloadGone) Tally {
	var t Tally
	if len(records) != n {
		t.Lost += max(n-len(records), 0)
		t.Lines = append(t.Lines, fmt.Sprintf("LOST: Gitea holds %d tasks, %d were queued", len(records), n))
	}
	byTask := map[int64][]ExecRecord{}
	for _, e := range execs {
		byTask[e.Task] = append(byTask[e.Task], e)
	}
	for _, r := range records {
		if f, ok := accepted(r); ok && !r.Reaped {
			if _, own := reportOf(f, byTask[r.ID]); own {
				t.OwnReports++
			}
		}
		v, why := judgeTask(r, byTask[r.ID], cut, gone)
		switch v {
		case Fine:
			continue
		case Cut:
			t.Cut++
		case Lost:
			t.Lost++
		case WronglyFailed:
			t.WronglyFailed++
		}
		t.Lines = append(t.Lines, fmt.Sprintf("%s: task %d: %s (finals %s; executors %s)", v, r.ID, why, finals(r.Finals), executors(byTask[r.ID])))
	}
	return t
}

// claimants says to which processes the claims were answered: how many
// went to a dispatch process of lives (and to how many of them), how many to
// an unknown or other process, for the record.
func claimants(records []TaskRecord, lives []Life) string {
	var dispatch, other int
	pids := map[int]bool{}
	for _, r := range records {
		c := r.Claim
		if c.Seq == 0 {
			continue
		}
		i := slices.IndexFunc(lives, func(l Life) bool { return c.Endpoint != "" && l.Endpoint == c.Endpoint })
		if i < 0 {
			other++
			continue
		}
		dispatch++
		pids[lives[i].PID] = true
	}
	return fmt.Sprintf("%d dispatch processes (%d claims), %d other or unknown", len(pids), dispatch, other)
}

// clock formats t for a line: local time to the millisecond.
func clock(t time.Time) string { return t.Local().Format("15:04:05.000") }

func name(r runnerv1.Result) string { return strings.TrimPrefix(r.String(), "RESULT_") }

func finals(fs []Final) string {
	var parts []string
	for _, f := range fs {
		s := fmt.Sprintf("%s by %s", name(f.Result), f.By)
		if f.Endpoint != "" {
			s += " via " + f.Endpoint
		}
		s += " at " + clock(f.At)
		if !f.Accepted {
			s += " (ignored)"
		}
		parts = append(parts, s)
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func executors(es []ExecRecord) string {
	var parts []string
	for _, e := range es {
		s := fmt.Sprintf("%s created %s", e.Sandbox, clock(e.Created))
		if !e.Started.IsZero() {
			s += " started " + clock(e.Started)
		}
		end := string(e.End)
		if e.End == ExecRunning {
			end = "running"
		}
		s += " " + end
		if e.End == ExecReported {
			s += fmt.Sprintf(" %s (answered %s)", name(e.Result), name(e.Answer))
		}
		if e.End == ExecNoTask {
			s += fmt.Sprintf(" (refused from %s: %s)", clock(refusedAt(e)), e.Refusal)
		}
		if !e.EndedAt.IsZero() {
			s += " at " + clock(e.EndedAt)
		}
		parts = append(parts, s)
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// poolsOf names the pools (poolsYAML) that take a job with labels.
func poolsOf(labels []string) []string {
	var out []string
	for _, l := range labels {
		switch l {
		case "ubuntu-latest":
			out = append(out, "linux")
		case "ubuntu-latest-arm":
			out = append(out, "arm")
		}
	}
	return out
}
