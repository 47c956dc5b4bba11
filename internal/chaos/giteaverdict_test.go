package chaos

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// fineJob is job n of the run as it must end: its steps' result, each step's
// earned conclusion, its mark once, attempt 1.
func fineJob(n int, code string) GiteaJobRecord {
	conclusion := "success"
	if code != "0" {
		conclusion = "failure"
	}
	return GiteaJobRecord{ID: int64(100 + n), Name: "work (" + code + ", " + strconv.Itoa(n) + ", 2)", Status: "completed",
		Conclusion: conclusion, Attempt: 1, Steps: []string{"success", "success", conclusion}, Marks: 1, HasLog: true}
}

// reaped is job n (a succeeding one) as Gitea's zombie reaper leaves a task
// no runner ever ran: failed, every step failed, no log, claimed at started.
func reaped(n int, started time.Time) GiteaJobRecord {
	j := fineJob(n, "0")
	j.Conclusion, j.Steps, j.Marks, j.Started, j.HasLog = "failure", []string{"failure", "failure", "failure"}, 0, started, false
	return j
}

func TestEarned(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		result string
		ok     bool
	}{
		{"work (0, 7, 3)", 7, "success", true},
		{"work (1, 12, 1)", 12, "failure", true},
		{"work (42, 3, 2)", 3, "failure", true},
		{"work (0, 3)", 0, "", false},
		{"work (0, x, 1)", 0, "", false},
		{"other (0, 1, 1)", 0, "", false},
		{"work (0, -1, 1)", 0, "", false},
	} {
		n, e, ok := Earned(tc.name)
		if ok != tc.ok || n != tc.n || e.Result != tc.result {
			t.Errorf("Earned(%q) = %d, %+v, %v; want %d, %s, %v", tc.name, n, e, ok, tc.n, tc.result, tc.ok)
		}
		if ok && (len(e.Steps) != ChaosGiteaSteps || e.Steps[ChaosGiteaSteps-1] != tc.result) {
			t.Errorf("Earned(%q) steps = %v", tc.name, e.Steps)
		}
	}
}

// TestChaosGiteaWorkflowNamesItsJobs: the workflow's matrix entries are in
// the order Earned reads a job's name in (n, code, sleep).
func TestChaosGiteaWorkflowNamesItsJobs(t *testing.T) {
	w := ChaosGiteaWorkflow(4, 10, []int{0, 1}, 3)
	for _, want := range []string{"- {n: 10, code: 0, sleep: 3}", "- {n: 11, code: 1, sleep: 4}", "exit ${{ matrix.code }}", "# round 4"} {
		if !strings.Contains(w, want) {
			t.Errorf("the workflow lacks %q:\n%s", want, w)
		}
	}
}

func TestJudgeGitea(t *testing.T) {
	edit := func(j GiteaJobRecord, f func(*GiteaJobRecord)) GiteaJobRecord { f(&j); return j }
	for _, tc := range []struct {
		name                string
		want                int
		jobs                []GiteaJobRecord
		ev                  CutEvidence
		leftovers           []string
		lost, wrong, leaked int
		cut                 int
		line                string // a line the verdict must print
	}{
		{"all fine", 3, []GiteaJobRecord{fineJob(0, "0"), fineJob(1, "1"), fineJob(2, "0")}, CutEvidence{}, nil, 0, 0, 0, 0, ""},
		{"a job never finished", 2, []GiteaJobRecord{fineJob(0, "0"), edit(fineJob(1, "0"), func(j *GiteaJobRecord) {
			j.Status, j.Conclusion = "in_progress", ""
		})}, CutEvidence{}, nil, 1, 0, 0, 0, "has no final result"},
		{"a job never created", 3, []GiteaJobRecord{fineJob(0, "0"), fineJob(2, "0")}, CutEvidence{}, nil, 1, 0, 0, 0, "job number 1 is not in Gitea"},
		{"a job cancelled", 1, []GiteaJobRecord{edit(fineJob(0, "0"), func(j *GiteaJobRecord) { j.Conclusion = "cancelled" })}, CutEvidence{}, nil, 1, 0, 0, 0, "nobody asked for"},
		{"a job not of the workflow", 1, []GiteaJobRecord{fineJob(0, "0"), {ID: 9, Name: "setup", Status: "completed", Conclusion: "success"}}, CutEvidence{}, nil, 1, 0, 0, 0, "not a job of the run"},
		{"wrongly failed: a healthy job failed", 1, []GiteaJobRecord{edit(fineJob(0, "0"), func(j *GiteaJobRecord) {
			j.Conclusion, j.Steps = "failure", []string{"success", "failure", "skipped"}
		})}, CutEvidence{}, nil, 0, 1, 0, 0, "wrongly-failed"},
		{"wrongly succeeded: a failing job succeeded", 1, []GiteaJobRecord{edit(fineJob(0, "1"), func(j *GiteaJobRecord) {
			j.Conclusion = "success"
		})}, CutEvidence{}, nil, 0, 1, 0, 0, "wrongly-succeeded"},
		{"failed, but not by its last step", 1, []GiteaJobRecord{edit(fineJob(0, "1"), func(j *GiteaJobRecord) {
			j.Steps = []string{"failure", "skipped", "skipped"}
		})}, CutEvidence{}, nil, 0, 1, 0, 0, "its steps ended"},
		{"failed with no step results (a failure of ours)", 1, []GiteaJobRecord{edit(fineJob(0, "1"), func(j *GiteaJobRecord) {
			j.Steps = nil
		})}, CutEvidence{}, nil, 0, 1, 0, 0, "its steps ended"},
		{"its mark missing from the log", 1, []GiteaJobRecord{edit(fineJob(0, "0"), func(j *GiteaJobRecord) { j.Marks = 0 })}, CutEvidence{}, nil, 0, 1, 0, 0, "0 times"},
		{"a step ran twice", 1, []GiteaJobRecord{edit(fineJob(0, "0"), func(j *GiteaJobRecord) { j.Marks = 2 })}, CutEvidence{}, nil, 0, 1, 0, 0, "2 times"},
		{"re-run", 1, []GiteaJobRecord{edit(fineJob(0, "0"), func(j *GiteaJobRecord) { j.Attempt = 2 })}, CutEvidence{}, nil, 0, 1, 0, 0, "re-run"},
		{"two jobs of one number", 1, []GiteaJobRecord{fineJob(0, "0"), edit(fineJob(0, "0"), func(j *GiteaJobRecord) { j.ID = 7 })}, CutEvidence{}, nil, 0, 1, 0, 0, "second job"},
		{"a job beyond those pushed", 1, []GiteaJobRecord{fineJob(0, "0"), fineJob(1, "0")}, CutEvidence{}, nil, 0, 1, 0, 0, "beyond"},
		{"a cut claim: reaped with no step, a kill 2 s after its claim, a task never received", 1,
			[]GiteaJobRecord{reaped(0, at(1000))}, CutEvidence{Kills: []time.Time{at(3000)}, Unreceived: 1}, nil, 0, 0, 0, 1, "zombie reaper"},
		{"not cut: no kill within ClaimTimeout after its claim", 1,
			[]GiteaJobRecord{reaped(0, at(1000))}, CutEvidence{Kills: []time.Time{at(500), at(1000 + 31000)}, Unreceived: 1}, nil, 0, 1, 0, 0, "no SIGKILL came"},
		{"not cut: local mode received every task", 1,
			[]GiteaJobRecord{reaped(0, at(1000))}, CutEvidence{Kills: []time.Time{at(3000)}, Unreceived: 0}, nil, 0, 1, 0, 0, "never received is left"},
		{"not cut: more reaped jobs than tasks never received", 2,
			[]GiteaJobRecord{reaped(0, at(1000)), reaped(1, at(1100))}, CutEvidence{Kills: []time.Time{at(3000)}, Unreceived: 1}, nil, 0, 1, 0, 1, "never received is left"},
		{"not cut: a step ran", 1,
			[]GiteaJobRecord{edit(reaped(0, at(1000)), func(j *GiteaJobRecord) { j.Steps = []string{"success", "failure", "failure"} })},
			CutEvidence{Kills: []time.Time{at(3000)}, Unreceived: 1}, nil, 0, 1, 0, 0, "wrongly-failed"},
		{"not cut: a runner wrote its log", 1,
			[]GiteaJobRecord{edit(reaped(0, at(1000)), func(j *GiteaJobRecord) { j.HasLog = true })},
			CutEvidence{Kills: []time.Time{at(3000)}, Unreceived: 1}, nil, 0, 1, 0, 0, "wrongly-failed"},
		{"an executor left", 1, []GiteaJobRecord{fineJob(0, "0")}, CutEvidence{}, []string{"executor local-5: its state directory"}, 0, 0, 1, 0, "LEAKED: executor local-5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := JudgeGitea(tc.want, tc.jobs, tc.ev, tc.leftovers)
			if got.Lost != tc.lost || got.Wrong != tc.wrong || got.Leaked != tc.leaked || got.Cut != tc.cut || got.Jobs != tc.want {
				t.Fatalf("tally = %+v; want %d lost, %d wrong, %d leaked, %d cut", got, tc.lost, tc.wrong, tc.leaked, tc.cut)
			}
			if n := tc.lost + tc.wrong + tc.leaked + tc.cut; len(got.Lines) != n {
				t.Fatalf("lines = %q; want %d", got.Lines, n)
			}
			if tc.line != "" && !strings.Contains(strings.Join(got.Lines, "\n"), tc.line) {
				t.Fatalf("lines = %q; want one with %q", got.Lines, tc.line)
			}
		})
	}
}

func TestGiteaTallyLine(t *testing.T) {
	got := GiteaTally{Jobs: 100, Lost: 1, Wrong: 2, Leaked: 3, Cut: 4}.Line(30, 2)
	if want := "chaos-gitea: 100 jobs, 30 kills, 2 gitea restarts, 1 lost, 2 wrongly-failed, 3 leaked"; got != want {
		t.Fatalf("line = %q, want %q", got, want)
	}
}
