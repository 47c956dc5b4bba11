package reporter

import (
	"slices"
	"testing"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/sirupsen/logrus"
)

const (
	S  = runnerv1.Result_RESULT_SUCCESS
	F  = runnerv1.Result_RESULT_FAILURE
	C  = runnerv1.Result_RESULT_CANCELLED
	SK = runnerv1.Result_RESULT_SKIPPED
)

// TestLayout feeds act-shaped entries and checks the log as Gitea's UI
// splits it: [set-up][step 0]…[step n][complete].
func TestLayout(t *testing.T) {
	tests := []struct {
		name         string
		steps        int
		secrets      map[string]string
		script       func(a *actLog, r *Reporter)
		wantSetup    []string
		wantSteps    [][]string
		wantComplete []string
		wantResults  []runnerv1.Result
		wantResult   runnerv1.Result
	}{{
		name:  "steps in order",
		steps: 3,
		script: func(a *actLog, r *Reporter) {
			r.Logf("received task 7 of job build")
			a.job.Infof("\U0001F680  Start image=-self-hosted")
			a.job.Debugf("a debug detail")
			a.job.WithField("raw_output", true).Infof("host environment output\n")
			a.step(0, "Pre").Infof("pre of step 0")
			s0 := a.step(0, "Main")
			run(s0, "echo 0")
			raw(s0, "zero-a")
			raw(s0, "zero-b")
			s0.Infof("::set-env:: X=1") // act's echo of a command: not a step row
			success(s0, "echo 0")
			s1 := a.step(1, "Main")
			run(s1, "echo 1")
			raw(s1, "one")
			success(s1, "echo 1")
			s2 := a.step(2, "Main")
			run(s2, "echo 2")
			raw(s2, "two")
			success(s2, "echo 2")
			a.step(0, "Post").Infof("\u2B50 Run Post echo 0")
			raw(a.step(0, "Post"), "post output")
			a.job.Infof("Cleaning up container for job build")
			a.jobResult("success")
		},
		wantSetup:    []string{"received task 7 of job build", "\U0001F680  Start image=-self-hosted", "host environment output", "pre of step 0", "\u2B50 Run Main echo 0"},
		wantSteps:    [][]string{{"zero-a", "zero-b"}, {"one"}, {"two"}},
		wantComplete: []string{"\u2B50 Run Post echo 0", "post output", "Cleaning up container for job build", "\U0001F3C1  Job succeeded"},
		wantResults:  []runnerv1.Result{S, S, S},
		wantResult:   S,
	}, {
		name:  "a failure, then a skipped step",
		steps: 3,
		script: func(a *actLog, r *Reporter) {
			s0 := a.step(0, "Main")
			run(s0, "echo 0")
			raw(s0, "ok")
			success(s0, "echo 0")
			s1 := a.step(1, "Main")
			run(s1, "false")
			raw(s1, "boom")
			failure(s1, "false")
			s1.Errorf("exit status 1") // the step wrapper's error: Error level counts as raw
			skip(a.step(2, "Main"), "echo 2")
			a.jobResult("failure")
		},
		wantSetup:    []string{"\u2B50 Run Main echo 0"},
		wantSteps:    [][]string{{"ok"}, {"boom", "  \u274C  Failure - Main false", "exit status 1"}, {}},
		wantComplete: []string{"\U0001F3C1  Job failed"},
		wantResults:  []runnerv1.Result{S, F, SK},
		wantResult:   F,
	}, {
		name:  "first step skipped",
		steps: 2,
		script: func(a *actLog, r *Reporter) {
			a.job.Infof("set up")
			skip(a.step(0, "Main"), "echo 0")
			s1 := a.step(1, "Main")
			run(s1, "echo 1") // after step 0's result: inside the steps, not a step row
			raw(s1, "one")
			success(s1, "echo 1")
			a.jobResult("success")
		},
		wantSetup:    []string{"set up"},
		wantSteps:    [][]string{{}, {"one"}},
		wantComplete: []string{"\U0001F3C1  Job succeeded"},
		wantResults:  []runnerv1.Result{SK, S},
		wantResult:   S,
	}, {
		name:  "composite sub-step results are not the step's",
		steps: 1,
		script: func(a *actLog, r *Reporter) {
			s0 := a.step(0, "Main")
			run(s0, "./my-action")
			raw(s0, "outer")
			inner := a.sub(0, "inner")
			run(inner, "inner")
			raw(inner, "inner output")
			failure(inner, "inner")
			skip(a.sub(0, "other"), "other")
			// Were the sub-step's result taken, the steps would be over and
			// this row would land outside step 0.
			run(a.sub(0, "third"), "third")
			raw(a.sub(0, "third"), "third output")
			success(s0, "./my-action")
			a.jobResult("success")
		},
		wantSetup:    []string{"\u2B50 Run Main ./my-action"},
		wantSteps:    [][]string{{"outer", "inner output", "  \u274C  Failure - Main inner", "third output"}},
		wantComplete: []string{"\U0001F3C1  Job succeeded"},
		wantResults:  []runnerv1.Result{S},
		wantResult:   S,
	}, {
		name:  "skipped job",
		steps: 2,
		script: func(a *actLog, r *Reporter) {
			a.job.Infof("evaluating if")
			a.job.WithField("jobResult", "skipped").Debugf("Skipping job 'build' due to 'false'")
		},
		wantSetup:    []string{"evaluating if"},
		wantSteps:    [][]string{{}, {}},
		wantComplete: []string{},
		wantResults:  []runnerv1.Result{SK, SK},
		wantResult:   SK,
	}, {
		name:  "workflow commands",
		steps: 1,
		script: func(a *actLog, r *Reporter) {
			s0 := a.step(0, "Main")
			run(s0, "script")
			raw(s0, "::add-mask::hunter2")
			raw(s0, "password is hunter2")
			raw(s0, "::debug::not shown without ACTIONS_STEP_DEBUG")
			raw(s0, "::group::Build")
			raw(s0, "::endgroup::")
			raw(s0, "##[add-mask]alpha%0Abravo")
			raw(s0, "alpha and bravo")
			raw(s0, "::stop-commands::pause123")
			raw(s0, "::add-mask::notamask")
			raw(s0, "::pause123::")
			raw(s0, "notamask")
			raw(s0, "::warning file=a.go,line=3::careful")
			success(s0, "script")
			a.jobResult("success")
		},
		wantSetup:    []string{"\u2B50 Run Main script"},
		wantSteps:    [][]string{{"password is ***", "::group::Build", "::endgroup::", "*** and ***", "::add-mask::notamask", "notamask", "::warning file=a.go,line=3::careful"}},
		wantComplete: []string{"\U0001F3C1  Job succeeded"},
		wantResults:  []runnerv1.Result{S},
		wantResult:   S,
	}, {
		name:    "debug command with ACTIONS_STEP_DEBUG",
		steps:   1,
		secrets: map[string]string{"ACTIONS_STEP_DEBUG": "true"},
		script: func(a *actLog, r *Reporter) {
			s0 := a.step(0, "Main")
			raw(s0, "::debug::shown 100%25")
			success(s0, "script")
			a.jobResult("success")
		},
		wantSetup:    []string{},
		wantSteps:    [][]string{{"shown 100%"}},
		wantComplete: []string{"\U0001F3C1  Job succeeded"},
		wantResults:  []runnerv1.Result{S},
		wantResult:   S,
	}, {
		name:  "lines, levels and UTF-8",
		steps: 1,
		script: func(a *actLog, r *Reporter) {
			a.job.Errorf("failed:\nsecond line\r\n")
			a.job.Tracef("trace is hidden")
			a.job.Warnf("warn is shown")
			s0 := a.step(0, "Main")
			s0.WithField("raw_output", true).Debugf("raw output at debug level\n") // LogOutput=false
			raw(s0, "bad \xff byte")
			success(s0, "x")
			a.jobResult("success")
		},
		wantSetup:    []string{"failed:\nsecond line", "warn is shown"},
		wantSteps:    [][]string{{"raw output at debug level", "bad \uFFFD byte"}},
		wantComplete: []string{"\U0001F3C1  Job succeeded"},
		wantResults:  []runnerv1.Result{S},
		wantResult:   S,
	}, {
		name:  "own rows while steps run wait for the last step",
		steps: 2,
		script: func(a *actLog, r *Reporter) {
			s0 := a.step(0, "Main")
			raw(s0, "zero")
			r.Logf("a note from the runner")
			success(s0, "x")
			s1 := a.step(1, "Main")
			raw(s1, "one")
			success(s1, "y")
			a.step(0, "Post").Infof("post")
			a.jobResult("success")
		},
		wantSetup:    []string{},
		wantSteps:    [][]string{{"zero"}, {"one"}},
		wantComplete: []string{"a note from the runner", "post", "\U0001F3C1  Job succeeded"},
		wantResults:  []runnerv1.Result{S, S},
		wantResult:   S,
	}, {
		name:  "post stage ends steps that never ran",
		steps: 3,
		script: func(a *actLog, r *Reporter) {
			s0 := a.step(0, "Main")
			raw(s0, "zero")
			failure(s0, "x")
			// act stopped (its context ended): steps 1 and 2 never start.
			a.step(0, "Post").Infof("post of step 0")
			a.job.Infof("Cleaning up container for job build")
			a.jobResult("failure")
		},
		wantSetup:    []string{},
		wantSteps:    [][]string{{"zero", "  \u274C  Failure - Main x"}, {}, {}},
		wantComplete: []string{"post of step 0", "Cleaning up container for job build", "\U0001F3C1  Job failed"},
		wantResults:  []runnerv1.Result{F, C, C},
		wantResult:   F,
	}, {
		name:  "late output of a failed step, before the next step",
		steps: 2,
		script: func(a *actLog, r *Reporter) {
			s0 := a.step(0, "Main")
			raw(s0, "zero")
			failure(s0, "x")
			raw(s0, "late zero")
			skip(a.step(1, "Main"), "y")
			a.jobResult("failure")
		},
		wantSetup:    []string{},
		wantSteps:    [][]string{{"zero", "  \u274C  Failure - Main x", "late zero"}, {}},
		wantComplete: []string{"\U0001F3C1  Job failed"},
		wantResults:  []runnerv1.Result{F, SK},
		wantResult:   F,
	}, {
		name:  "late output of a failed step, after the next step printed",
		steps: 3,
		script: func(a *actLog, r *Reporter) {
			s0 := a.step(0, "Main")
			raw(s0, "zero")
			failure(s0, "x")
			s1 := a.step(1, "Main") // if: always()
			raw(s1, "one")
			raw(s0, "late zero") // shown with step 1 rather than breaking the layout
			success(s1, "y")
			skip(a.step(2, "Main"), "z")
			a.jobResult("failure")
		},
		wantSetup:    []string{},
		wantSteps:    [][]string{{"zero", "  \u274C  Failure - Main x"}, {"one", "late zero"}, {}},
		wantComplete: []string{"\U0001F3C1  Job failed"},
		wantResults:  []runnerv1.Result{F, S, SK},
		wantResult:   F,
	}, {
		name:  "late output of the last step, after the steps",
		steps: 1,
		script: func(a *actLog, r *Reporter) {
			s0 := a.step(0, "Main")
			raw(s0, "zero")
			failure(s0, "x")
			a.step(0, "Post").Infof("post")
			raw(s0, "late zero")
			a.jobResult("failure")
		},
		wantSetup:    []string{},
		wantSteps:    [][]string{{"zero", "  \u274C  Failure - Main x"}},
		wantComplete: []string{"post", "late zero", "\U0001F3C1  Job failed"},
		wantResults:  []runnerv1.Result{F},
		wantResult:   F,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.steps, tt.secrets, nil)
			tt.script(h.act, h.r)
			if err := h.r.Close(""); err != nil {
				t.Fatalf("Close: %v", err)
			}
			setup, steps, complete := h.fake.layout()
			if !slices.Equal(setup, tt.wantSetup) {
				t.Errorf("set-up rows = %q, want %q", setup, tt.wantSetup)
			}
			for i := range tt.wantSteps {
				if i >= len(steps) || !slices.Equal(steps[i], tt.wantSteps[i]) {
					t.Errorf("step %d rows = %q, want %q", i, steps[i], tt.wantSteps[i])
				}
			}
			if !slices.Equal(complete, tt.wantComplete) {
				t.Errorf("complete rows = %q, want %q", complete, tt.wantComplete)
			}
			if got := results(h.fake.storedSteps()); !slices.Equal(got, tt.wantResults) {
				t.Errorf("step results = %v, want %v", got, tt.wantResults)
			}
			snap := h.fake.snapshot()
			if snap.status != tt.wantResult || h.r.Result() != tt.wantResult {
				t.Errorf("result: Gitea %v, Result() %v, want %v", snap.status, h.r.Result(), tt.wantResult)
			}
			if err := h.fake.contiguous(); err != nil {
				t.Error(err)
			}
			if snap.violations != nil {
				t.Errorf("protocol violations: %q", snap.violations)
			}
			for _, s := range h.fake.storedSteps() {
				if s.GetResult() != SK && s.GetResult() != C && (s.GetStartedAt() == nil || s.GetStoppedAt() == nil) {
					t.Errorf("step %d ran but lacks a start or stop time: %v", s.GetId(), s)
				}
			}
		})
	}
}

func TestLevelsAreAll(t *testing.T) {
	h := newHarness(t, 0, nil, nil)
	if got := h.r.Levels(); !slices.Equal(got, logrus.AllLevels) {
		t.Fatalf("Levels() = %v", got)
	}
}

func TestStartedAtFromFirstEntry(t *testing.T) {
	h := newHarness(t, 1, nil, nil)
	h.act.job.Tracef("first, hidden")
	h.r.mu.Lock()
	started := h.r.state.GetStartedAt()
	h.r.mu.Unlock()
	if started == nil {
		t.Fatal("the first entry, even a hidden one, did not set StartedAt")
	}
}

func TestParseCommand(t *testing.T) {
	tests := []struct {
		line, name, value string
		ok                bool
	}{
		{"::add-mask::abc", "add-mask", "abc", true},
		{"::warning file=a,line=1::msg::with colons", "warning", "msg::with colons", true},
		{"  ::debug::indented", "debug", "indented", true},
		{"##[group]Title", "group", "Title", true},
		{"##[error file=x;line=2]bad", "error", "bad", true},
		{"::endgroup::", "endgroup", "", true},
		{":: spaced::x", "", "", false},
		{"::nope", "", "", false},
		{"plain text", "", "", false},
		{"##[]x", "", "", false},
	}
	for _, tt := range tests {
		name, value, ok := parseCommand(tt.line)
		if name != tt.name || value != tt.value || ok != tt.ok {
			t.Errorf("parseCommand(%q) = %q, %q, %v; want %q, %q, %v", tt.line, name, value, ok, tt.name, tt.value, tt.ok)
		}
	}
}
