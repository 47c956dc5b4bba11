//go:build !race

// act v0.261.10's host mode has a data race of its own (container/host_environment.go:
// exec sets ptyWriter.AutoStop while the pty copier reads it), so this test
// cannot run under the race detector.

package reporter

import (
	"context"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nektos/act/pkg/common"
	"github.com/nektos/act/pkg/model"
	"github.com/nektos/act/pkg/runner"
	"github.com/sirupsen/logrus"
)

// discardLoggers is act's job logger factory: only the hook sees entries.
type discardLoggers struct{}

func (discardLoggers) WithJobLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// TestWithAct runs a real job with act v0.261.10 in host mode, the
// reporter as its hook, and checks what Gitea would store: the hook fields
// are act's own, not a copy of them.
func TestWithAct(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("host mode needs bash")
	}
	// Host mode runs in a fresh workspace: the first step writes the
	// composite action that step 3 uses.
	const workflow = `
name: ci
on: push
jobs:
  build:
    runs-on: ubuntu-latest
    steps:
      - run: |
          mkdir -p inner
          cat > inner/action.yml <<'EOF'
          name: inner
          runs:
            using: composite
            steps:
              - run: echo inner one
                shell: bash
              - if: false
                run: echo inner skipped
                shell: bash
              - run: echo inner two
                shell: bash
          EOF
          echo zero
          echo "::add-mask::dyn-secret-42"
          echo "masked dyn-secret-42"
      - name: print ${{ secrets.PASS }}
        run: echo "pass ${{ secrets.PASS }}"
      - if: false
        run: echo never
      - uses: ./inner
      - run: |
          echo failing
          sleep 0.2
          exit 3
      - run: echo after failure
`
	wf, err := model.ReadWorkflow(strings.NewReader(workflow))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := model.CombineWorkflowPlanner(wf).PlanJob("build")
	if err != nil {
		t.Fatal(err)
	}
	steps := len(wf.GetJob("build").Steps)

	work := t.TempDir()
	task := testTask(nil)
	fake := newFake(task.GetId(), steps)
	r := New(context.Background(), fake, task, steps, testOptions(&syncBuffer{}, func(o *Options) { o.StateInterval = 20 * time.Millisecond }))
	r.Start()
	r.Logf("received task %d of job build", task.GetId())

	cfg := &runner.Config{
		Workdir:        work,
		ActionCacheDir: t.TempDir(),
		LogOutput:      true,
		AutoRemove:     true,
		NoSkipCheckout: true,
		Secrets:        task.GetSecrets(),
		GitHubInstance: "gitea.example.com",
		EventJSON:      "{}",
		PlatformPicker: func([]string) string { return "-self-hosted" },
		PresetGitHubContext: &model.GithubContext{
			Event: map[string]any{}, EventName: "push", Repository: "alice/demo", RepositoryOwner: "alice",
			RunID: "42", RunNumber: "1", RunAttempt: "1", Actor: "alice", Sha: strings.Repeat("a", 40),
			Ref: "refs/heads/main", RefName: "main", RefType: "branch", Token: secToken,
		},
	}
	rr, err := runner.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := common.WithLoggerHook(r.JobContext(), r)
	ctx = runner.WithJobLoggerFactory(ctx, discardLoggers{})
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	execErr := rr.NewPlanExecutor(plan)(ctx)
	if err := r.Close(""); err != nil {
		t.Fatalf("Close: %v (act: %v)", err, execErr)
	}

	snap := fake.snapshot()
	if snap.status != F || snap.finalApplied != 1 || !snap.archivedAtFinal {
		t.Fatalf("Gitea: result %v, %d final calls, archived first %v", snap.status, snap.finalApplied, snap.archivedAtFinal)
	}
	if snap.violations != nil {
		t.Fatalf("violations: %q", snap.violations)
	}
	if got, want := results(fake.storedSteps()), []runnerv1.Result{S, S, SK, S, F, SK}; !slices.Equal(got, want) {
		t.Errorf("step results = %v, want %v", got, want)
	}
	if err := fake.contiguous(); err != nil {
		t.Error(err)
	}
	setup, stepRows, complete := fake.layout()
	wantIn := func(where string, rows []string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !slices.Contains(rows, w) {
				t.Errorf("%s: no row %q in %q", where, w, rows)
			}
		}
	}
	wantIn("set-up", setup, "received task 7 of job build")
	wantIn("step 0", stepRows[0], "zero", "masked ***")
	wantIn("step 1", stepRows[1], "pass ***")
	wantIn("step 3", stepRows[3], "inner one", "inner two")
	wantIn("step 4", stepRows[4], "failing")
	if len(stepRows[2]) != 0 || len(stepRows[5]) != 0 {
		t.Errorf("skipped steps have rows: %q, %q", stepRows[2], stepRows[5])
	}
	if !slices.ContainsFunc(complete, func(s string) bool { return strings.Contains(s, "Job failed") }) {
		t.Errorf("complete: no job result row in %q", complete)
	}
	all := fake.contents()
	assertNoSecrets(t, "a stored row", all, "dyn-secret-42")
	if t.Failed() || testing.Verbose() {
		for i, row := range all {
			t.Logf("%3d %s", i, row)
		}
		for _, s := range fake.storedSteps() {
			t.Logf("step %d: %v at %d+%d", s.GetId(), s.GetResult(), s.GetLogIndex(), s.GetLogLength())
		}
	}
}
