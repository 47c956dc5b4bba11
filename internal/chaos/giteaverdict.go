package chaos

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
)

// The verdict of the chaos run against the real Gitea (TestChaosGitea,
// `make chaos-gitea`): pure functions over what Gitea's REST API says of
// each job after the drain, and what the process backend left behind, so
// that each rule can be fed the case it must catch (giteaverdict_test.go).
//
// Every job of the run earns its result from its steps alone: the workflow
// (ChaosGiteaWorkflow) has one job per matrix entry, named "work (<code>,
// <n>, <sleep>)", whose steps sleep, print the job's mark once, and exit with
// <code>. So the earned result is success when code is 0 and failure
// otherwise, and the earned step conclusions are success for every step
// but the last, which has the job's result. Nobody cancels a job in this
// run, and no job is re-run.

// EarnedJob is what a job of the run earns from its steps.
type EarnedJob struct {
	// Result is "success" or "failure".
	Result string
	// Steps are the earned conclusions of the job's steps, in order (the
	// workflow's steps, as Gitea's jobs API lists them).
	Steps []string
}

// ChaosGiteaSteps is the number of user steps of each job of the workflow.
const ChaosGiteaSteps = 3

// ChaosGiteaWorkflow is the workflow of push round (a different file content
// each round, so each push is a new commit): one job per entry of codes, job
// n (counted from first) sleeping 2 + n%sleeps seconds in its first step,
// printing its mark (MarkOf; the script's own text is not the mark, so a log that echoes the script counts it once) in its second, and exiting with codes[n] in its
// third.
func ChaosGiteaWorkflow(round, first int, codes []int, sleeps int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: chaos\n# round %d\non: [push]\njobs:\n  work:\n    runs-on: ubuntu-latest\n    strategy:\n      max-parallel: 100\n      matrix:\n        include:\n", round)
	for i, code := range codes {
		n := first + i
		fmt.Fprintf(&b, "          - {n: %d, code: %d, sleep: %d}\n", n, code, 2+n%sleeps)
	}
	b.WriteString("    steps:\n" +
		"      - run: sleep ${{ matrix.sleep }}\n" +
		"      - run: printf 'chaos-mark-%s-once\\n' ${{ matrix.n }}\n" +
		"      - run: exit ${{ matrix.code }}\n")
	return b.String()
}

// MarkOf is the line job n prints once, in its second step.
func MarkOf(n int) string { return fmt.Sprintf("chaos-mark-%d-once", n) }

// Earned parses a job name of the workflow, "work (<code>, <n>, <sleep>)"
// (Gitea 1.27.3 names a matrix job by its values in the order of their keys'
// names), into the job's number and what its steps earn; false for any
// other name.
func Earned(name string) (int, EarnedJob, bool) {
	inner, ok := strings.CutPrefix(name, "work (")
	if !ok || !strings.HasSuffix(inner, ")") {
		return 0, EarnedJob{}, false
	}
	parts := strings.Split(strings.TrimSuffix(inner, ")"), ", ")
	if len(parts) != 3 {
		return 0, EarnedJob{}, false
	}
	code, err1 := strconv.Atoi(parts[0])
	n, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || n < 0 || code < 0 {
		return 0, EarnedJob{}, false
	}
	e := EarnedJob{Result: "success"}
	if code != 0 {
		e.Result = "failure"
	}
	for range ChaosGiteaSteps - 1 {
		e.Steps = append(e.Steps, "success")
	}
	e.Steps = append(e.Steps, e.Result)
	return n, e, true
}

// GiteaJobRecord is what Gitea's API says of one job after the drain.
type GiteaJobRecord struct {
	ID         int64
	Name       string
	Status     string   // "completed" once it has a final result
	Conclusion string   // its final result
	Attempt    int64    // run attempt (1: never re-run)
	Steps      []string // the conclusion of each user step, as Gitea lists them
	// Marks is how many times the job's mark (MarkOf) appears in its log:
	// 1 when its second step ran once and its log reached Gitea.
	Marks int
	// Started is when Gitea handed the job's task to a runner (a FetchTask
	// answer): the claim.
	Started time.Time
	// HasLog is whether Gitea holds a log of the job (a runner wrote one).
	HasLog bool
	// TaskID is the task Gitea created for the job (its claim), 0 if it
	// created none or its task cannot be told (Gitea lists tasks by job
	// name, and two jobs or two tasks share it).
	TaskID int64
}

// CutEvidence is what a cut claim is judged from.
type CutEvidence struct {
	// Received are the IDs of the tasks any life of local mode logged
	// receiving ("job picked up", written as the FetchTask answer arrives).
	Received map[int64]bool
	// Lives are local mode's lives, in order: each from its start to its
	// SIGKILL (Killed zero for a life not killed).
	Lives []LocalLife
	// GiteaKills are the moments Gitea was SIGKILLed.
	GiteaKills []time.Time
}

// LocalLife is one process of local mode, from its start to its SIGKILL.
type LocalLife struct {
	Started, Killed time.Time
}

// claimResolution is how finely Gitea records a claim's moment (its
// started_at is Unix seconds): the claim came in [Started, Started+1s).
const claimResolution = time.Second

// cutClaimGitea reports whether job j's claim was cut: the one window
// Gitea's runner protocol leaves (docs/OPERATIONS.md): Gitea created the
// task and answered FetchTask, and the answer never reached local mode
// because local mode or Gitea was SIGKILLed first; Gitea cannot hand the task
// out again, and fails it as a zombie after ZOMBIE_TASK_TIMEOUT. Proof, all
// of: the job failed with no log (no runner ever wrote a line of it) and
// every step failed, as Gitea 1.27.3's reaper marks the steps it created at
// the claim (seen in a run; none ran: a run step that failed leaves the
// next ones skipped); its task's ID is known and no life of local mode
// logged receiving it (ev.Received); and the kill nearest after the claim
// (the first SIGKILL of local mode or of Gitea at or after Started) came at
// most dispatcher.ClaimTimeout after it (the longest a FetchTask answer is
// awaited) and, if it was local mode's, ended the life that was running at
// the claim (started before the claim's second ended): a claim made while
// local mode was down is not the next life's. The second string says why
// not, "" when j is no reaped claim at all.
func cutClaimGitea(j GiteaJobRecord, ev CutEvidence) (bool, string) {
	if j.Status != "completed" || j.Conclusion != "failure" || j.HasLog || j.Started.IsZero() ||
		slices.ContainsFunc(j.Steps, func(c string) bool { return c != "failure" }) {
		return false, ""
	}
	if j.TaskID == 0 {
		return false, "its task is not known (Gitea lists none, or several, by its name)"
	}
	if ev.Received[j.TaskID] {
		return false, fmt.Sprintf("local mode received its task %d", j.TaskID)
	}
	var kill time.Time
	var life *LocalLife
	for i, l := range ev.Lives {
		if !l.Killed.IsZero() && !l.Killed.Before(j.Started) && (kill.IsZero() || l.Killed.Before(kill)) {
			kill, life = l.Killed, &ev.Lives[i]
		}
	}
	for _, k := range ev.GiteaKills {
		if !k.Before(j.Started) && (kill.IsZero() || k.Before(kill)) {
			kill, life = k, nil
		}
	}
	switch after := kill.Sub(j.Started); {
	case kill.IsZero() || after > dispatcher.ClaimTimeout:
		return false, fmt.Sprintf("no SIGKILL came within %s after its claim at %s", dispatcher.ClaimTimeout, clock(j.Started))
	case life != nil && !life.Started.Before(j.Started.Add(claimResolution)):
		return false, fmt.Sprintf("the kill nearest after its claim at %s (%s) ended a life of local mode started after its claim, at %s",
			clock(j.Started), clock(kill), clock(life.Started))
	case life == nil:
		return true, fmt.Sprintf("job %d %q claimed at %s as task %d, never received; Gitea SIGKILLed %s later; failed by Gitea's zombie reaper with no step run",
			j.ID, j.Name, clock(j.Started), j.TaskID, after.Round(time.Millisecond))
	default:
		return true, fmt.Sprintf("job %d %q claimed at %s as task %d, never received; local mode SIGKILLed %s later; failed by Gitea's zombie reaper with no step run",
			j.ID, j.Name, clock(j.Started), j.TaskID, after.Round(time.Millisecond))
	}
}

// GiteaTally is the verdict over a run.
type GiteaTally struct {
	Jobs, Lost, Wrong, Leaked int
	// Cut counts the cut claims (cutClaimGitea), printed apart: no failure.
	Cut int
	// Lines name every job that is not fine, and every leftover.
	Lines []string
}

// judgeGiteaJob judges one job: lost when it has no final result (not
// completed, or a conclusion that is neither success nor failure: nobody
// cancels or skips a job here), wrong when its final result, its steps'
// conclusions or its log are not what its steps earn (wrongly failed, or
// wrongly succeeded), fine otherwise. The string says why.
func judgeGiteaJob(j GiteaJobRecord) (Verdict, string) {
	n, earned, ok := Earned(j.Name)
	switch {
	case !ok:
		return Lost, fmt.Sprintf("job %d %q is not a job of the run's workflow", j.ID, j.Name)
	case j.Status != "completed":
		return Lost, fmt.Sprintf("job %d %q has no final result (status %s)", j.ID, j.Name, j.Status)
	case j.Conclusion != "success" && j.Conclusion != "failure":
		return Lost, fmt.Sprintf("job %d %q ended %s, which nobody asked for", j.ID, j.Name, j.Conclusion)
	case j.Conclusion != earned.Result:
		how := "wrongly-failed"
		if j.Conclusion == "success" {
			how = "wrongly-succeeded"
		}
		return WronglyFailed, fmt.Sprintf("job %d %q %s: Gitea holds %s, its steps earn %s (steps %v)", j.ID, j.Name, how, j.Conclusion, earned.Result, j.Steps)
	case j.Attempt != 1:
		return WronglyFailed, fmt.Sprintf("job %d %q was re-run (attempt %d)", j.ID, j.Name, j.Attempt)
	case !slices.Equal(j.Steps, earned.Steps):
		return WronglyFailed, fmt.Sprintf("job %d %q: its steps ended %v, they earn %v", j.ID, j.Name, j.Steps, earned.Steps)
	case j.Marks != 1:
		return WronglyFailed, fmt.Sprintf("job %d %q: its log shows %s %d times, want once", j.ID, j.Name, MarkOf(n), j.Marks)
	}
	return Fine, ""
}

// JudgeGitea judges a run that pushed want jobs, numbered 0 to want-1: each
// job Gitea holds (judgeGiteaJob; a job it finds wrongly failed is a cut
// claim instead when cutClaimGitea proves it from ev), each number with no job (lost: Gitea
// never created it or it vanished) or with more than one (the surplus is
// wrong: nobody re-runs a job here), and each leftover of the backend after
// the drain (an executor's state or process: leaked).
func JudgeGitea(want int, jobs []GiteaJobRecord, ev CutEvidence, leftovers []string) GiteaTally {
	t := GiteaTally{Jobs: want}
	seen := map[int]int{}
	for _, j := range jobs {
		v, why := judgeGiteaJob(j)
		if n, _, ok := Earned(j.Name); ok {
			seen[n]++
			if n >= want {
				v, why = WronglyFailed, fmt.Sprintf("job %d %q is beyond the %d jobs pushed", j.ID, j.Name, want)
			} else if seen[n] > 1 {
				v, why = WronglyFailed, fmt.Sprintf("job %d %q is a second job of number %d", j.ID, j.Name, n)
			}
		}
		if v == WronglyFailed {
			if cut, reason := cutClaimGitea(j, ev); cut {
				v, why = Cut, reason
			} else if reason != "" {
				why += "; not a cut claim: " + reason
			}
		}
		switch v {
		case Cut:
			t.Cut++
		case Lost:
			t.Lost++
		case WronglyFailed:
			t.Wrong++
		default:
			continue
		}
		t.Lines = append(t.Lines, v.String()+": "+why)
	}
	for n := range want {
		if seen[n] == 0 {
			t.Lost++
			t.Lines = append(t.Lines, fmt.Sprintf("LOST: job number %d is not in Gitea", n))
		}
	}
	for _, l := range leftovers {
		t.Leaked++
		t.Lines = append(t.Lines, "LEAKED: "+l)
	}
	return t
}

// CutLine is printed before Line: the cut claims, apart from the verdict.
func (t GiteaTally) CutLine() string {
	return fmt.Sprintf("chaos-gitea: %d cut claims (judged apart: the window Gitea's runner protocol leaves)", t.Cut)
}

// Line is the run's one line: kills of local mode and restarts of Gitea
// beside the verdict's counts.
func (t GiteaTally) Line(kills, giteaRestarts int) string {
	return fmt.Sprintf("chaos-gitea: %d jobs, %d kills, %d gitea restarts, %d lost, %d wrongly-failed, %d leaked",
		t.Jobs, kills, giteaRestarts, t.Lost, t.Wrong, t.Leaked)
}
