package executor

import "github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"

// Event is one lifecycle transition of an assignment. By construction it
// carries only names, IDs and a phase: never an environment value, a
// credential or anything from the task payload.
type Event struct {
	Name         EventName
	AssignmentID string
	TaskID       int64
	Backend      taskassignment.BackendKind
	// Executor and Phase are empty when there is no executor.
	Executor string
	Phase    Phase
}

// EventName names a lifecycle transition.
type EventName string

const (
	EventExecutorAbsent        EventName = "executor_absent"
	EventExecutorCreated       EventName = "executor_created"
	EventExecutorFound         EventName = "executor_found"
	EventIdentityTargetPending EventName = "identity_target_pending"
	EventIdentityBound         EventName = "identity_bound"
	EventTaskTerminal          EventName = "task_terminal"
	EventTaskReported          EventName = "task_reported"
	EventExecutorDeleted       EventName = "executor_deleted"
	// EventTaskEnded: Accept found no executor and the assignment marked
	// ended; it creates none.
	EventTaskEnded EventName = "task_ended"
)

func (w Worker) emit(name EventName, a taskassignment.Assignment, executor *Executor) {
	if w.OnEvent == nil {
		return
	}
	e := Event{Name: name, AssignmentID: a.ID, TaskID: a.Task.ID, Backend: a.Backend}
	if executor != nil {
		e.Executor = executor.Name
		e.Phase = executor.Phase
	}
	w.OnEvent(e)
}
