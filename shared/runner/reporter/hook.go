package reporter

import (
	"fmt"
	"strings"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The fields act (gitea.com/gitea/act v0.261.10, pkg/runner) puts on the
// entries its job logger hands to the hook.
const (
	// fieldStage is "Pre", "Main" or "Post" (stepStage.String()) on step
	// entries, absent on job-level ones.
	fieldStage = "stage"
	// fieldStepNumber is the int index of the step in job.Steps.
	fieldStepNumber = "stepNumber"
	// fieldStepID is a []string: the step's id, plus one id per level of
	// composite action.
	fieldStepID = "stepID"
	// fieldRaw is true on the lines a step or the job environment printed.
	fieldRaw = "raw_output"
	// fieldStepResult is a model.StepResult outcome (a fmt.Stringer:
	// "success", "failure", "skipped").
	fieldStepResult = "stepResult"
	// fieldJobResult is a string: "success", "failure" or "skipped".
	fieldJobResult = "jobResult"

	stageMain = "Main"
	stagePost = "Post"
)

// Levels implements logrus.Hook: every level, because act logs skipped
// steps and a skipped job at Debug.
func (r *Reporter) Levels() []logrus.Level { return logrus.AllLevels }

// Fire implements logrus.Hook for act's job logger (common.WithLoggerHook).
// It never blocks on the network and never fails. It records the task's and
// the steps' progress and appends rows, so that Gitea's log reads
// [set-up][step 0]…[step n][complete]:
//
//   - Entries of stage Main with a known stepNumber are step entries: the
//     step's first entry starts it; its lines (raw_output, or Error level
//     and above) are the step's rows, contiguous at its LogIndex; a
//     stepResult stops it, unless it comes from a composite action's
//     sub-step (len(stepID) > 1).
//   - Other entries are job-level: a jobResult ends the job and every step
//     still without a result (CANCELLED, or SKIPPED for a skipped job).
//     A jobResult after Gitea ended the task is ignored, and so is act's
//     "success" after JobContext was cancelled (act reports success after
//     a cancel). The first Post entry also ends the steps still without a
//     result: act runs Post stages only after every Main stage.
//   - Rows that are not a step's own appear only outside the steps (before
//     step 0's first row or result, after the last step's result), and,
//     unless raw, only at Info level and above.
//
// Entries arriving after Close are ignored.
func (r *Reporter) Fire(e *logrus.Entry) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	t := e.Time
	if t.IsZero() {
		t = r.opt.Now()
	}
	ts := timestamppb.New(t)
	if r.state.StartedAt == nil {
		r.state.StartedAt = ts
	}

	raw := e.Data[fieldRaw] == true || e.Level <= logrus.ErrorLevel
	shown := raw || e.Level <= logrus.InfoLevel
	stage, _ := e.Data[fieldStage].(string)

	var step *runnerv1.StepState
	if stage == stageMain {
		if i, ok := stepIndex(e.Data[fieldStepNumber]); ok && i >= 0 && i < len(r.state.Steps) {
			step = r.state.Steps[i]
		}
	}
	if step == nil {
		r.jobEntryLocked(e, t, ts, stage, raw, shown)
	} else {
		r.stepEntryLocked(e, step, t, ts, raw, shown)
	}
	r.drainDeferredLocked()
	return nil
}

func (r *Reporter) jobEntryLocked(e *logrus.Entry, t time.Time, ts *timestamppb.Timestamp, stage string, raw, shown bool) {
	if stage == stagePost && r.endStepsLocked(runnerv1.Result_RESULT_CANCELLED, ts) {
		r.markUrgentLocked()
	}
	keep := true
	if v, ok := e.Data[fieldJobResult]; ok {
		if res, ok := parseResult(v); ok {
			keep = r.jobResultLocked(res, ts)
		}
	}
	// Rows held back while the steps ran go before this entry's.
	r.drainDeferredLocked()
	if !shown {
		return
	}
	lines := r.linesLocked(e.Message, raw)
	if keep && !r.duringStepsLocked() {
		r.appendLocked(t, lines)
	}
}

// jobResultLocked applies act's job result and reports whether its row is
// worth showing (not act's "success" for a job that was stopped).
func (r *Reporter) jobResultLocked(res runnerv1.Result, ts *timestamppb.Timestamp) bool {
	ignored := r.serverResult != runnerv1.Result_RESULT_UNSPECIFIED ||
		(res == runnerv1.Result_RESULT_SUCCESS && r.jobCtx.Err() != nil)
	fill := runnerv1.Result_RESULT_CANCELLED
	if res == runnerv1.Result_RESULT_SKIPPED && !ignored {
		fill = runnerv1.Result_RESULT_SKIPPED
	}
	r.endStepsLocked(fill, ts)
	r.markUrgentLocked()
	if ignored {
		return res != runnerv1.Result_RESULT_SUCCESS
	}
	r.state.Result = res
	r.state.StoppedAt = ts
	return true
}

func (r *Reporter) stepEntryLocked(e *logrus.Entry, step *runnerv1.StepState, t time.Time, ts *timestamppb.Timestamp, raw, shown bool) {
	if step.StartedAt == nil {
		step.StartedAt = ts
		r.markUrgentLocked()
	}
	if shown {
		lines := r.linesLocked(e.Message, raw)
		switch {
		case raw:
			for _, c := range lines {
				r.appendStepRowLocked(int(step.Id), &runnerv1.LogRow{Time: timestamppb.New(t), Content: c})
			}
		case !r.duringStepsLocked():
			r.appendLocked(t, lines)
		}
	}
	if v, ok := e.Data[fieldStepResult]; ok && stepIDDepth(e.Data[fieldStepID]) <= 1 {
		if res, ok := parseResult(v); ok {
			if step.LogLength == 0 {
				step.LogIndex = r.endLocked()
			}
			step.Result = res
			step.StoppedAt = ts
			r.markUrgentLocked()
		}
	}
}

// appendStepRowLocked appends a row of step k where it keeps every step's
// rows contiguous. Act can deliver a failed command's last lines after the
// step's result (host mode stops copying its pty output early), even after
// a later step printed: such a row goes to the step that holds the end of
// the log, or, once the steps are over, to "Complete job".
func (r *Reporter) appendStepRowLocked(k int, row *runnerv1.LogRow) {
	steps := r.state.Steps
	target := k
	if r.tail != k {
		open := steps[k].LogLength == 0 && steps[len(steps)-1].Result == runnerv1.Result_RESULT_UNSPECIFIED
		for _, s := range steps[k+1:] {
			open = open && s.LogLength == 0
		}
		if !open {
			target = r.tail
		}
	}
	if target < 0 {
		if !r.duringStepsLocked() {
			r.appendRowLocked(row)
		}
		return
	}
	s := steps[target]
	if s.LogLength == 0 {
		s.LogIndex = r.endLocked()
	}
	s.LogLength++
	r.appendRowLocked(row)
	r.tail = target
}

// duringStepsLocked reports whether rows now belong to a step: from step
// 0's first row or result until the last step has a result.
func (r *Reporter) duringStepsLocked() bool {
	steps := r.state.Steps
	if len(steps) == 0 {
		return false
	}
	if first := steps[0]; first.Result == runnerv1.Result_RESULT_UNSPECIFIED && first.LogLength == 0 {
		return false
	}
	return steps[len(steps)-1].Result == runnerv1.Result_RESULT_UNSPECIFIED
}

// endStepsLocked gives every step without a result the result fill (and a
// stop time if it started); it reports whether any step changed.
func (r *Reporter) endStepsLocked(fill runnerv1.Result, ts *timestamppb.Timestamp) bool {
	changed := false
	for _, s := range r.state.Steps {
		if s.Result != runnerv1.Result_RESULT_UNSPECIFIED {
			continue
		}
		s.Result = fill
		if s.StartedAt != nil && s.StoppedAt == nil {
			s.StoppedAt = ts
		}
		if s.LogLength == 0 {
			s.LogIndex = r.endLocked()
		}
		changed = true
	}
	return changed
}

// endLocked is the index the next row will have in Gitea's log.
func (r *Reporter) endLocked() int64 { return r.logOffset + int64(len(r.rows)) }

func (r *Reporter) markUrgentLocked() {
	r.urgent = true
	r.signalLocked()
}

// linesLocked turns one act message into row contents: nothing, or one row
// (Gitea escapes a newline inside a row; splitting act's messages would
// show, say, the lines of a failed step's script as if they were output).
// A raw message may be a
// workflow command: add-mask records a mask and shows nothing; debug shows
// its value only with secrets.ACTIONS_STEP_DEBUG == "true"; stop-commands
// shows nothing and turns commands off until its token comes back (also
// shown as nothing); other commands show verbatim. An add-mask in a message
// of act's own is honoured too. Then come masking and valid UTF-8.
func (r *Reporter) linesLocked(msg string, raw bool) []string {
	msg = strings.TrimRight(msg, "\r\n")
	name, value, isCmd := parseCommand(msg)
	switch {
	case !isCmd:
	case raw && r.stopToken != "":
		if name == r.stopToken {
			r.stopToken = ""
			return nil
		}
	case strings.EqualFold(name, "add-mask"):
		r.addMaskLocked(value)
		return nil
	case !raw:
	case strings.EqualFold(name, "debug"):
		if !r.debug {
			return nil
		}
		msg = commandData.Replace(value)
	case strings.EqualFold(name, "stop-commands") && value != "":
		r.stopToken = value
		return nil
	}
	return []string{r.contentLocked(msg)}
}

// contentLocked masks s and makes it valid UTF-8.
func (r *Reporter) contentLocked(s string) string {
	return strings.ToValidUTF8(r.masks.mask(s), "\uFFFD")
}

// addMaskLocked records an add-mask value, escaped and unescaped.
func (r *Reporter) addMaskLocked(v string) {
	added := r.masks.add(v)
	if u := commandData.Replace(v); u != v {
		added = r.masks.add(u) || added
	}
	if added {
		r.remaskLocked()
	}
}

// remaskLocked applies the current masks to the rows not yet acknowledged.
// A row may already be on its way; rows are replaced, never modified.
func (r *Reporter) remaskLocked() {
	for _, rows := range [][]*runnerv1.LogRow{r.rows, r.deferred} {
		for i, row := range rows {
			if c := r.masks.mask(row.GetContent()); c != row.GetContent() {
				rows[i] = &runnerv1.LogRow{Time: row.GetTime(), Content: c}
			}
		}
	}
}

func (r *Reporter) appendLocked(t time.Time, lines []string) {
	for _, c := range lines {
		r.appendRowLocked(&runnerv1.LogRow{Time: timestamppb.New(t), Content: c})
	}
}

// appendRowLocked appends a row that is no step's; appendStepRowLocked
// then marks it as its step's.
func (r *Reporter) appendRowLocked(row *runnerv1.LogRow) {
	r.tail = -1
	r.rows = append(r.rows, row)
	r.fresh++
	if r.fresh == 1 || r.fresh >= r.opt.MaxBufferedRows {
		r.signalLocked()
	}
}

// appendOwnLocked appends the runner's own text, one row per line (a panic's
// trace reads better so), or holds it back while steps run.
func (r *Reporter) appendOwnLocked(t time.Time, text string) {
	text = r.contentLocked(strings.TrimRight(text, "\r\n")) // masked whole: a multi-line secret spans lines
	for _, c := range strings.Split(text, "\n") {
		c = strings.TrimRight(c, "\r")
		row := &runnerv1.LogRow{Time: timestamppb.New(t), Content: c}
		if r.duringStepsLocked() {
			r.deferred = append(r.deferred, row)
		} else {
			r.appendRowLocked(row)
		}
	}
}

// drainDeferredLocked appends the held-back rows once the steps are over.
func (r *Reporter) drainDeferredLocked() {
	if len(r.deferred) == 0 || r.duringStepsLocked() {
		return
	}
	for _, row := range r.deferred {
		r.appendRowLocked(row)
	}
	r.deferred = nil
}

func stepIndex(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case int32:
		return int(n), true
	}
	return 0, false
}

func stepIDDepth(v any) int {
	if ids, ok := v.([]string); ok {
		return len(ids)
	}
	return 0
}

// parseResult reads act's "success", "failure", "cancelled" or "skipped",
// given as a string (jobResult) or a fmt.Stringer (stepResult).
func parseResult(v any) (runnerv1.Result, bool) {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case fmt.Stringer:
		s = x.String()
	default:
		return 0, false
	}
	switch strings.ToLower(s) {
	case "success":
		return runnerv1.Result_RESULT_SUCCESS, true
	case "failure":
		return runnerv1.Result_RESULT_FAILURE, true
	case "cancelled":
		return runnerv1.Result_RESULT_CANCELLED, true
	case "skipped":
		return runnerv1.Result_RESULT_SKIPPED, true
	}
	return 0, false
}
