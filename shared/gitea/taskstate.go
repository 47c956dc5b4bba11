package gitea

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Reporter is what TaskState calls of a registration (*Client, or a
// wrapper of it that watches what Gitea answers).
type Reporter interface {
	UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error)
	UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error)
}

// TaskState asks Gitea about the tasks one registration claimed, and ends
// those whose executor cannot. It implements executor.TaskState. Every
// method is idempotent: Gitea never changes a finished task, which keeps
// answering its first final result.
type TaskState struct {
	Client Reporter
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (s TaskState) now() time.Time {
	if s.Now == nil {
		return time.Now()
	}
	return s.Now()
}

// Result sends a heartbeat for the task (refreshing Gitea's zombie clock) and
// returns Gitea's view: RESULT_UNSPECIFIED while it runs, otherwise its final
// result (CANCELLED also while it is being cancelled).
//
// A heartbeat carries no steps, and Gitea recomputes the steps a report
// leaves out: on a task whose executor already reports, a finished step shows
// as running until the executor's next report (seconds). Keep-alives must
// therefore stop once the executor reports.
func (s TaskState) Result(ctx context.Context, taskID int64) (runnerv1.Result, error) {
	res, err := s.Client.UpdateTask(ctx, &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: taskID}})
	if err != nil {
		return 0, fmt.Errorf("task %d: %w", taskID, err)
	}
	return res.GetState().GetResult(), nil
}

// Terminal reports whether the task is over in Gitea: done, cancelled or
// being cancelled, or gone (taskassignment.ErrTaskGone: its repository deleted, or no
// longer this runner's). A gone task is over for us: its executor is
// deleted and its payload dropped, instead of failing every pass for ever.
func (s TaskState) Terminal(ctx context.Context, taskID int64) (bool, error) {
	r, err := s.Result(ctx, taskID)
	if errors.Is(err, taskassignment.ErrTaskGone) {
		return true, nil
	}
	return r != runnerv1.Result_RESULT_UNSPECIFIED, err
}

// Report ends a task whose executor finished while Gitea still has it
// running: the executor stopped without reporting a result. The job is
// marked failed, whatever the phase, with a log row saying why (the
// backend's reason when it has one: an image that cannot be pulled): a job
// whose steps never reported is never shown green. A task already over is
// left as it is.
func (s TaskState) Report(ctx context.Context, taskID int64, e executor.Executor) error {
	terminal, err := s.Terminal(ctx, taskID)
	if err != nil || terminal {
		return err
	}
	reason := fmt.Sprintf("gitea-dynamic-runner: the executor ended (%s) without reporting a result; the job is marked failed", e.Phase)
	if e.Reason != "" {
		reason = fmt.Sprintf("gitea-dynamic-runner: the executor could not run the job: %s; the job is marked failed", e.Reason)
	}
	return s.Finalize(ctx, taskID, runnerv1.Result_RESULT_FAILURE, reason)
}

// Finalize ends a task that no executor will report on: it appends reason as
// the last log row and archives the log, then sends result with stopped_at
// now. Repeating it is harmless: an archived log and a finished task keep
// what they have.
func (s TaskState) Finalize(ctx context.Context, taskID int64, result runnerv1.Result, reason string) error {
	now := timestamppb.New(s.now())
	// An empty batch at index 0 reads the acknowledged row count for free.
	ack, err := s.Client.UpdateLog(ctx, &runnerv1.UpdateLogRequest{TaskId: taskID})
	if err != nil {
		return fmt.Errorf("task %d: read log offset: %w", taskID, err)
	}
	_, err = s.Client.UpdateLog(ctx, &runnerv1.UpdateLogRequest{
		TaskId: taskID, Index: ack.GetAckIndex(), NoMore: true,
		Rows: []*runnerv1.LogRow{{Time: now, Content: reason}},
	})
	if err != nil && CodeOf(err) != connect.CodeAlreadyExists { // already archived
		return fmt.Errorf("task %d: final log row: %w", taskID, err)
	}
	_, err = s.Client.UpdateTask(ctx, &runnerv1.UpdateTaskRequest{
		State: &runnerv1.TaskState{Id: taskID, Result: result, StoppedAt: now},
	})
	if err != nil {
		return fmt.Errorf("task %d: final result: %w", taskID, err)
	}
	return nil
}
