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
// no runner ever ran: failed, every step failed, no log, claimed at started
// as task 500+n.
func reaped(n int, started time.Time) GiteaJobRecord {
	j := fineJob(n, "0")
	j.Conclusion, j.Steps, j.Marks, j.Started, j.HasLog = "failure", []string{"failure", "failure", "failure"}, 0, started, false
	j.TaskID = int64(500 + n)
	return j
}

// life is a life of local mode from startMs to its SIGKILL at killMs.
func life(startMs, killMs int) LocalLife { return LocalLife{Started: at(startMs), Killed: at(killMs)} }

// cutEvidence is what TestChaosGitea gathers: local mode's lives, Gitea's
// kills, the task IDs local mode received.
func cutEvidence(received []int64, lives []LocalLife, giteaKills ...time.Time) CutEvidence {
	ev := CutEvidence{Lives: lives, GiteaKills: giteaKills, Received: map[int64]bool{}}
	for _, id := range received {
		ev.Received[id] = true
	}
	return ev
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
		{"a cut claim: reaped with no step, its life SIGKILLed 2 s after its claim, its task never received", 1,
			[]GiteaJobRecord{reaped(0, at(1000))}, cutEvidence(nil, []LocalLife{life(0, 3000)}), nil, 0, 0, 0, 1, "zombie reaper"},
		{"a cut claim: Gitea SIGKILLed 200 ms after the claim", 1,
			[]GiteaJobRecord{reaped(0, at(1000))}, cutEvidence(nil, []LocalLife{life(0, 60000)}, at(1200)), nil, 0, 0, 0, 1, "Gitea SIGKILLed"},
		{"not cut: no kill within ClaimTimeout after its claim", 1,
			[]GiteaJobRecord{reaped(0, at(1000))}, cutEvidence(nil, []LocalLife{life(0, 500), life(600, 1000+31000)}), nil, 0, 1, 0, 0, "no SIGKILL came"},
		{"not cut: local mode received its task", 1,
			[]GiteaJobRecord{reaped(0, at(1000))}, cutEvidence([]int64{500}, []LocalLife{life(0, 3000)}), nil, 0, 1, 0, 0, "local mode received its task 500"},
		// Matched by ID, not by count: the job whose task local mode never
		// received is the cut one, whichever comes first.
		{"two reaped jobs, local mode received the first one's task", 2,
			[]GiteaJobRecord{reaped(0, at(1000)), reaped(1, at(1100))}, cutEvidence([]int64{500}, []LocalLife{life(0, 3000)}),
			nil, 0, 1, 0, 1, "local mode received its task 500"},
		{"not cut: its task is not known", 1,
			[]GiteaJobRecord{edit(reaped(0, at(1000)), func(j *GiteaJobRecord) { j.TaskID = 0 })},
			cutEvidence(nil, []LocalLife{life(0, 3000)}), nil, 0, 1, 0, 0, "its task is not known"},
		// The window is the life the nearest kill ended: a claim made while
		// local mode was down is not cut by the next life's kill.
		{"not cut: claimed while local mode was down, the next life killed within ClaimTimeout", 1,
			[]GiteaJobRecord{reaped(0, at(1000))}, cutEvidence(nil, []LocalLife{life(0, 900), life(2500, 5000)}),
			nil, 0, 1, 0, 0, "started after its claim"},
		{"not cut: a step ran", 1,
			[]GiteaJobRecord{edit(reaped(0, at(1000)), func(j *GiteaJobRecord) { j.Steps = []string{"success", "failure", "failure"} })},
			cutEvidence(nil, []LocalLife{life(0, 3000)}), nil, 0, 1, 0, 0, "wrongly-failed"},
		{"not cut: a runner wrote its log", 1,
			[]GiteaJobRecord{edit(reaped(0, at(1000)), func(j *GiteaJobRecord) { j.HasLog = true })},
			cutEvidence(nil, []LocalLife{life(0, 3000)}), nil, 0, 1, 0, 0, "wrongly-failed"},
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
