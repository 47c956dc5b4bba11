package main

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
)

// Messages of the job event lines, one line per event and job.
const (
	msgPickedUp = "job picked up"
	msgRunning  = "job running"
	msgFinished = "job finished"
)

// jobEvents says what happens to each job, one log line per event, as
// act_runner users are used to: picked up (task, job, repository, run URL),
// running (its executor), finished (result, URL, duration since picked up).
//
// Invariants: a line never holds a task's token, secrets or workflow, only
// its ID, job name, repository and URL; a task is said finished once, and a
// task picked up by an earlier local mode (before a restart) is still said
// finished: with its details when its payload was still stored at the
// start (resume), without them otherwise.
type jobEvents struct {
	log *slog.Logger
	// now is the clock; nil means time.Now.
	now func() time.Time

	mu   sync.Mutex
	jobs map[int64]jobSeen  // tasks picked up and not finished
	done map[int64]struct{} // tasks said finished, bounded by maxFinished
}

// jobSeen is what the picked-up line said of a task, for the later lines.
type jobSeen struct {
	job, repository, url string
	at                   time.Time
	running              bool
}

// maxFinished bounds the finished tasks remembered (so that Gitea's answers
// about them after the end say nothing twice); past it the memory starts
// afresh.
const maxFinished = 4096

func newJobEvents(log *slog.Logger) *jobEvents {
	return &jobEvents{log: log, jobs: map[int64]jobSeen{}, done: map[int64]struct{}{}}
}

func (e *jobEvents) clock() time.Time {
	if e.now == nil {
		return time.Now()
	}
	return e.now()
}

// pickedUp says task was claimed from Gitea.
func (e *jobEvents) pickedUp(task *runnerv1.Task) {
	j := e.remember(task, e.clock())
	e.log.Info(msgPickedUp, slog.Int64("task", task.GetId()), slog.String("job", j.job),
		slog.String("repository", j.repository), slog.String("url", j.url))
}

// resume remembers task, claimed at claimed by an earlier local mode on
// this state directory (its payload is still stored), without saying it
// again: its later lines say what they would have said without the
// restart.
func (e *jobEvents) resume(task *runnerv1.Task, claimed time.Time) {
	e.remember(task, claimed)
}

func (e *jobEvents) remember(task *runnerv1.Task, at time.Time) jobSeen {
	f := task.GetContext().GetFields()
	j := jobSeen{job: f["job"].GetStringValue(), repository: f["repository"].GetStringValue(), url: poolstatus.RunURL(task), at: at}
	e.mu.Lock()
	e.jobs[task.GetId()] = j
	delete(e.done, task.GetId())
	e.mu.Unlock()
	return j
}

// running says taskID's executor was created; said once a task.
func (e *jobEvents) running(taskID int64, executor string) {
	e.mu.Lock()
	j, ok := e.jobs[taskID]
	if ok && j.running {
		e.mu.Unlock()
		return
	}
	j.running = true
	if ok {
		e.jobs[taskID] = j
	}
	e.mu.Unlock()
	attrs := []any{slog.Int64("task", taskID)}
	if j.job != "" {
		attrs = append(attrs, slog.String("job", j.job))
	}
	e.log.Info(msgRunning, append(attrs, slog.String("executor", executor))...)
}

// finished says taskID ended with result (not RESULT_UNSPECIFIED); said
// once a task.
func (e *jobEvents) finished(taskID int64, result runnerv1.Result) {
	e.mu.Lock()
	if _, said := e.done[taskID]; said {
		e.mu.Unlock()
		return
	}
	if len(e.done) >= maxFinished {
		clear(e.done)
	}
	e.done[taskID] = struct{}{}
	j, ok := e.jobs[taskID]
	delete(e.jobs, taskID)
	e.mu.Unlock()
	attrs := []any{slog.Int64("task", taskID)}
	if ok {
		attrs = append(attrs, slog.String("job", j.job))
	}
	attrs = append(attrs, slog.String("result", resultName(result)))
	if ok {
		attrs = append(attrs, slog.String("url", j.url), slog.String("duration", e.clock().Sub(j.at).Round(100*time.Millisecond).String()))
	}
	e.log.Info(msgFinished, attrs...)
}

// resultName is result as Gitea shows it: success, failure, cancelled,
// skipped.
func resultName(r runnerv1.Result) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "RESULT_"))
}

// registration is what local mode calls of its Gitea registration
// (gitea.Client): dispatch's claims, the gateway's forwarded reports and
// recover's and handle's questions and final results.
type registration interface {
	Declare(ctx context.Context, labels []string) error
	FetchTask(ctx context.Context) (*runnerv1.Task, error)
	UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error)
	UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error)
}

// watched is local mode's registration, telling events of every task Gitea
// hands out and of every final result it holds: the one place that sees
// every job begin and end, whoever reports the end (the job's runner through
// the gateway, a cancel in Gitea, recover failing a job whose executor
// died).
type watched struct {
	registration
	events *jobEvents
}

// FetchTask claims a task; one claimed is picked up.
func (w watched) FetchTask(ctx context.Context) (*runnerv1.Task, error) {
	task, err := w.registration.FetchTask(ctx)
	if err == nil && task != nil {
		w.events.pickedUp(task)
	}
	return task, err
}

// UpdateTask reports a task's state; once Gitea holds a final result (the
// one sent, or the one it answers: a job cancelled in Gitea), the task is
// finished.
func (w watched) UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	res, err := w.registration.UpdateTask(ctx, req)
	if err != nil {
		return res, err
	}
	result := res.GetState().GetResult()
	if result == runnerv1.Result_RESULT_UNSPECIFIED {
		result = req.GetState().GetResult()
	}
	if result != runnerv1.Result_RESULT_UNSPECIFIED {
		w.events.finished(req.GetState().GetId(), result)
	}
	return res, nil
}
