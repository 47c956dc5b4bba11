// Package executortest has executor.Backend implementations for tests of the
// parts above a backend (handle, recover): Memory, held in the test
// process, and Files, held in a directory so that it survives a killed
// process. Both honour the Backend contract: every method is idempotent.
package executortest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// Memory is an executor.Backend in memory, safe for concurrent use.
type Memory struct {
	// Target is the identity target a created executor gets ("" = pending).
	Target string
	// Keys and TrustDomain rebuild assignments in RecoverAssignments.
	Keys        taskassignment.Keys
	TrustDomain spiffeid.TrustDomain

	mu        sync.Mutex
	executors map[string]executor.Executor
	specs     map[string]executor.LaunchSpec
	creates   int
	binds     int
}

// NewMemory returns an empty Memory whose executors get target.
func NewMemory(target string) *Memory {
	return &Memory{Target: target, executors: map[string]executor.Executor{}, specs: map[string]executor.LaunchSpec{}}
}

func (m *Memory) Find(_ context.Context, id string) (*executor.Executor, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.executors[id]; ok {
		return &e, nil
	}
	return nil, nil
}

func (m *Memory) Create(_ context.Context, a taskassignment.Assignment, spec executor.LaunchSpec) (*executor.Executor, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.executors[a.ID]; ok {
		return &e, nil
	}
	m.creates++
	e := executor.Executor{Name: "executor-" + a.ID, IdentityTarget: m.Target, Phase: executor.PhasePending}
	m.executors[a.ID] = e
	m.specs[a.ID] = spec
	return &e, nil
}

func (m *Memory) BindIdentity(context.Context, *executor.Executor, taskidentity.Identity) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.binds++
	return nil
}

func (m *Memory) Delete(_ context.Context, e *executor.Executor) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, x := range m.executors {
		if x.Name == e.Name {
			delete(m.executors, id)
		}
	}
	return nil
}

// RecoverAssignments rebuilds the assignment of every executor from the
// metadata it was created with (executors added with Set have none and are
// skipped).
func (m *Memory) RecoverAssignments(context.Context) ([]taskassignment.Assignment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []taskassignment.Assignment
	for id := range m.executors {
		a, found, err := m.rebuild(id)
		if err != nil {
			return nil, err
		}
		if found {
			out = append(out, a)
		}
	}
	return out, nil
}

// RecoverAssignment rebuilds the assignment of one executor, as
// RecoverAssignments does; found is false when there is none (or it was
// added with Set).
func (m *Memory) RecoverAssignment(_ context.Context, id string) (taskassignment.Assignment, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rebuild(id)
}

// rebuild is RecoverAssignment with m.mu held.
func (m *Memory) rebuild(id string) (taskassignment.Assignment, bool, error) {
	spec, ok := m.specs[id]
	if _, exists := m.executors[id]; !ok || !exists {
		return taskassignment.Assignment{}, false, nil
	}
	a, err := m.Keys.FromMetadata(spec.Metadata.Labels, spec.Metadata.Annotations, m.TrustDomain)
	if err != nil {
		return taskassignment.Assignment{}, false, fmt.Errorf("executor of %s: %w", id, err)
	}
	return a, true, nil
}

// Set replaces the executor of an assignment (to move it to a phase or give
// it a target).
func (m *Memory) Set(assignmentID string, e executor.Executor) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.executors[assignmentID] = e
}

// Creates counts the executors created so far.
func (m *Memory) Creates() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.creates
}

// Spec returns the launch spec an assignment's executor was created with.
func (m *Memory) Spec(assignmentID string) (executor.LaunchSpec, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.specs[assignmentID]
	return s, ok
}

// Files is a Backend kept in a directory: one file per executor, plus a
// creates.log with one line per Create that made an executor. Processes that
// share the directory share the backend (one at a time).
type Files struct {
	Dir    string
	Target string
	// AfterCreate, if set, runs after an executor is written and before
	// Create returns: the place to stop a process to simulate a crash.
	AfterCreate func(assignmentID string)
}

func (f Files) path(id string) string { return filepath.Join(f.Dir, id+".json") }

func (f Files) Find(_ context.Context, id string) (*executor.Executor, error) {
	data, err := os.ReadFile(f.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var e executor.Executor
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("executor file of %s: %w", id, err)
	}
	return &e, nil
}

func (f Files) Create(ctx context.Context, a taskassignment.Assignment, _ executor.LaunchSpec) (*executor.Executor, error) {
	if e, err := f.Find(ctx, a.ID); err != nil || e != nil {
		return e, err
	}
	e := executor.Executor{Name: "executor-" + a.ID, IdentityTarget: f.Target, Phase: executor.PhasePending}
	data, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(f.path(a.ID), data, 0o600); err != nil {
		return nil, err
	}
	log, err := os.OpenFile(filepath.Join(f.Dir, "creates.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = fmt.Fprintln(log, a.ID)
	if cerr := log.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if f.AfterCreate != nil {
		f.AfterCreate(a.ID)
	}
	return &e, nil
}

func (f Files) BindIdentity(context.Context, *executor.Executor, taskidentity.Identity) error {
	return nil
}

// errFilesList is what Files answers a listing: it keeps no assignment
// metadata to rebuild assignments from (the crash tests that use it list
// nothing; use Memory for recover).
var errFilesList = errors.New("executortest.Files keeps no assignment metadata to list")

// RecoverAssignments fails: see errFilesList.
func (f Files) RecoverAssignments(context.Context) ([]taskassignment.Assignment, error) {
	return nil, errFilesList
}

func (f Files) Delete(_ context.Context, e *executor.Executor) error {
	id := strings.TrimPrefix(e.Name, "executor-")
	if err := os.Remove(f.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
