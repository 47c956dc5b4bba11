package reporter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/proto"
)

// fakeGitea is a Client with Gitea 1.27.3's rules for one task
// (routers/api/actions/runner/runner.go UpdateLog and UpdateTask,
// models/actions/task.go UpdateTaskByState), and switches for failures.
type fakeGitea struct {
	taskID int64
	nSteps int

	mu sync.Mutex

	// The log.
	rows     []*runnerv1.LogRow
	archived bool
	logReqs  []*runnerv1.UpdateLogRequest

	// The task. status is UNSPECIFIED while running, else the stored result.
	status     runnerv1.Result
	cancelling bool
	stopped    time.Time
	steps      []*runnerv1.StepState // as Gitea stored them
	claimed    []*runnerv1.StepState // as the last UpdateTask sent them
	outputs    map[string]string
	taskReqs   []*runnerv1.UpdateTaskRequest
	taskTimes  []time.Time

	finalAttempts   int      // final UpdateTasks received, failed ones included
	finalApplied    int      // final UpdateTasks Gitea processed
	outputsAtFinal  []string // keys stored when the first processed final arrived
	archivedAtFinal bool     // whether the log was archived then
	violations      []string // protocol misuse by the reporter

	// Switches.
	failLogBefore   int   // the next N UpdateLogs fail (transport) unprocessed
	failLogAfter    int   // the next N UpdateLogs are processed, then their answer is lost
	failTaskBefore  int   // the next N UpdateTasks fail (transport) unprocessed
	failFinalBefore int   // the next N final UpdateTasks fail (transport) unprocessed
	transportErr    error // the failure of the switches above (default: unavailable)
	logErr          error // every UpdateLog answers this
	finalErr        error // every final UpdateTask answers this
}

func newFake(taskID int64, nSteps int) *fakeGitea {
	return &fakeGitea{taskID: taskID, nSteps: nSteps, outputs: map[string]string{}}
}

var errUnavailable = connect.NewError(connect.CodeUnavailable, errors.New("dial tcp 127.0.0.1:3000: connect: connection refused"))

func (f *fakeGitea) transport() error {
	if f.transportErr != nil {
		return f.transportErr
	}
	return errUnavailable
}

// giteaError is an error as a Connect client sees Gitea's: code unknown,
// the real code in the text.
func giteaError(code, desc string) error {
	return connect.NewError(connect.CodeUnknown, fmt.Errorf("rpc error: code = %s desc = %s", code, desc))
}

func (f *fakeGitea) UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logReqs = append(f.logReqs, proto.Clone(req).(*runnerv1.UpdateLogRequest))
	if f.failLogBefore > 0 {
		f.failLogBefore--
		return nil, f.transport()
	}
	if f.logErr != nil {
		return nil, f.logErr
	}
	if req.GetTaskId() != f.taskID {
		return nil, giteaError("Internal", "invalid runner for task")
	}
	for _, row := range req.GetRows() {
		if !utf8.ValidString(row.GetContent()) {
			return nil, connect.NewError(connect.CodeInternal, errors.New("marshal message: string field contains invalid UTF-8"))
		}
	}
	ack := int64(len(f.rows))
	if req.GetIndex() > ack {
		f.violations = append(f.violations, fmt.Sprintf("UpdateLog index %d beyond ack %d (a gap)", req.GetIndex(), ack))
	}
	var rows []*runnerv1.LogRow
	if req.GetIndex() <= ack && ack < req.GetIndex()+int64(len(req.GetRows())) {
		rows = req.GetRows()[ack-req.GetIndex():]
	}
	if f.archived {
		if len(rows) > 0 {
			return nil, giteaError("AlreadyExists", "log file has been archived")
		}
		return &runnerv1.UpdateLogResponse{AckIndex: ack}, nil
	}
	if len(rows) == 0 && (!req.GetNoMore() || req.GetIndex() > ack) {
		return &runnerv1.UpdateLogResponse{AckIndex: ack}, nil
	}
	for _, row := range rows {
		f.rows = append(f.rows, proto.Clone(row).(*runnerv1.LogRow))
	}
	if req.GetNoMore() {
		f.archived = true
	}
	if f.failLogAfter > 0 {
		f.failLogAfter--
		return nil, f.transport()
	}
	return &runnerv1.UpdateLogResponse{AckIndex: int64(len(f.rows))}, nil
}

func (f *fakeGitea) UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := req.GetState()
	final := st.GetResult() != runnerv1.Result_RESULT_UNSPECIFIED
	f.taskReqs = append(f.taskReqs, proto.Clone(req).(*runnerv1.UpdateTaskRequest))
	f.taskTimes = append(f.taskTimes, time.Now())
	if final {
		f.finalAttempts++
	}
	if f.failTaskBefore > 0 {
		f.failTaskBefore--
		return nil, f.transport()
	}
	if final && f.failFinalBefore > 0 {
		f.failFinalBefore--
		return nil, f.transport()
	}
	if final && f.finalErr != nil {
		return nil, f.finalErr
	}
	if st.GetId() != f.taskID {
		return nil, giteaError("Internal", "update task: invalid runner for task")
	}
	if len(st.GetSteps()) != f.nSteps {
		f.violations = append(f.violations, fmt.Sprintf("UpdateTask with %d steps, want all %d", len(st.GetSteps()), f.nSteps))
	}
	f.claimed = nil
	for _, s := range st.GetSteps() {
		f.claimed = append(f.claimed, proto.Clone(s).(*runnerv1.StepState))
	}
	if final {
		f.finalApplied++
		if f.finalApplied == 1 {
			f.outputsAtFinal = slices.Sorted(maps.Keys(f.outputs))
			f.archivedAtFinal = f.archived
		}
	}
	if f.status == runnerv1.Result_RESULT_UNSPECIFIED { // not done: the first final result wins
		if final {
			f.status = st.GetResult()
			if f.cancelling {
				f.status = runnerv1.Result_RESULT_CANCELLED
			}
			if st.GetStoppedAt() != nil {
				f.stopped = st.GetStoppedAt().AsTime()
			}
		}
		f.steps = nil
		for _, s := range st.GetSteps() {
			f.steps = append(f.steps, proto.Clone(s).(*runnerv1.StepState))
		}
	}
	for k, v := range req.GetOutputs() { // insert-if-absent, even on a done task
		if len(k) > maxOutputKey || len(v) > maxOutputValue {
			continue
		}
		if _, ok := f.outputs[k]; !ok {
			f.outputs[k] = v
		}
	}
	res := f.status
	if res == runnerv1.Result_RESULT_UNSPECIFIED && f.cancelling {
		res = runnerv1.Result_RESULT_CANCELLED
	}
	return &runnerv1.UpdateTaskResponse{
		State:       &runnerv1.TaskState{Id: st.GetId(), Result: res},
		SentOutputs: slices.Sorted(maps.Keys(f.outputs)),
	}, nil
}

// cancel is a user's cancel: with the cancelling handshake the task keeps
// running as cancelling; without it, it is cancelled at once.
func (f *fakeGitea) cancel(handshake bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.status != runnerv1.Result_RESULT_UNSPECIFIED {
		return
	}
	if handshake {
		f.cancelling = true
	} else {
		f.status = runnerv1.Result_RESULT_CANCELLED
	}
}

func (f *fakeGitea) set(fn func(f *fakeGitea)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// contents returns the stored log.
func (f *fakeGitea) contents() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.rows))
	for i, r := range f.rows {
		out[i] = r.GetContent()
	}
	return out
}

func (f *fakeGitea) storedSteps() []*runnerv1.StepState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.steps)
}

// claimedSteps returns the steps of the last UpdateTask Gitea processed:
// the reporter's view, also for a task Gitea had already ended.
func (f *fakeGitea) claimedSteps() []*runnerv1.StepState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.claimed)
}

func (f *fakeGitea) heartbeats() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.taskReqs {
		if r.GetState().GetResult() == runnerv1.Result_RESULT_UNSPECIFIED {
			n++
		}
	}
	return n
}

func (f *fakeGitea) snapshot() fakeGitea {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fakeGitea{
		status: f.status, archived: f.archived, finalAttempts: f.finalAttempts, finalApplied: f.finalApplied,
		outputsAtFinal: slices.Clone(f.outputsAtFinal), archivedAtFinal: f.archivedAtFinal,
		violations: slices.Clone(f.violations), outputs: maps.Clone(f.outputs),
		logReqs: slices.Clone(f.logReqs), taskReqs: slices.Clone(f.taskReqs),
	}
}

// layout splits the stored log by the steps the reporter claimed, as Gitea's UI does (modules/actions/task_state.go
// FullSteps): "Set up job" up to the first step that ran, each step's
// range, "Complete job" after set-up plus every step's length.
func (f *fakeGitea) layout() (setup []string, steps [][]string, complete []string) {
	rows := f.contents()
	st := f.claimedSteps()
	preLen := int64(len(rows))
	for _, s := range st {
		if s.GetResult() == runnerv1.Result_RESULT_SUCCESS || s.GetResult() == runnerv1.Result_RESULT_FAILURE ||
			(s.GetResult() == runnerv1.Result_RESULT_UNSPECIFIED && s.GetStartedAt() != nil) {
			preLen = s.GetLogIndex()
			break
		}
	}
	clamp := func(i int64) int64 { return max(0, min(i, int64(len(rows)))) }
	setup = rows[:clamp(preLen)]
	total := preLen
	for _, s := range st {
		steps = append(steps, rows[clamp(s.GetLogIndex()):clamp(s.GetLogIndex()+s.GetLogLength())])
		total += s.GetLogLength()
	}
	complete = rows[clamp(total):]
	return setup, steps, complete
}

// contiguous reports where step ranges are not back to back.
func (f *fakeGitea) contiguous() error {
	var errs []string
	end := int64(-1)
	for _, s := range f.claimedSteps() {
		if s.GetLogLength() == 0 {
			continue
		}
		if end >= 0 && s.GetLogIndex() != end {
			errs = append(errs, fmt.Sprintf("step %d starts at %d, previous step ended at %d", s.GetId(), s.GetLogIndex(), end))
		}
		end = s.GetLogIndex() + s.GetLogLength()
	}
	if errs != nil {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}
