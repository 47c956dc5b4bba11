// Package process runs executors as local child processes (local
// mode). Every executor's metadata lives in a state directory, one JSON file
// per assignment, so the backend works across a restart of everything: a
// child runs in its own process group and outlives its parent, and writes
// its exit status to a file the backend reads back.
//
// There is no isolation beyond the operating system's user: a process
// executor is for one machine that trusts its workflows.
package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// DefaultSVIDTTL is how long an executor's SVID is valid when Config
// leaves it zero: Gitea's 3-hour job limit and an hour to report.
const DefaultSVIDTTL = 4 * time.Hour

// Config is the configuration of the process backend.
type Config struct {
	// Dir holds one subdirectory per executor (created if absent).
	Dir string
	// Runner is the runner binary, started with RunnerArgs.
	Runner     string
	RunnerArgs []string
	// Pools are the runner pools of the installation; the backend serves
	// those whose backend is process, and refuses the assignment of any
	// other pool (executor.Permanent): a signed assignment for a pod pool, or
	// for a pool this installation does not have, never runs as a host
	// process.
	Pools runnerpool.Pools
	// Keys and TrustDomain rebuild assignments for recover.
	Keys        taskassignment.Keys
	TrustDomain spiffeid.TrustDomain
	// Minter gives each executor its SVID (svidca.CA): no SPIRE agent
	// attests a local process, and without an SVID the runner cannot reach
	// the gateway.
	Minter bootstrap.Minter
	// SVIDTTL is how long an SVID is valid; zero is DefaultSVIDTTL.
	SVIDTTL time.Duration
	// Env is added to every executor's environment (PATH, HOME, ...); the
	// launch environment comes on top.
	Env []string
	// OnCorrupt hears of executors whose metadata does not rebuild.
	OnCorrupt func(name string, err error)
	// OnExit, if set, hears of each executor this Backend started once its
	// process has ended and been reaped: its status file, if the runner
	// wrote one, is complete, and Find reports the executor finished. It is
	// called on the goroutine that reaped the child and must not block.
	//
	// It is in memory only: an executor started by an earlier process (local
	// mode before a restart) ends unheard, as does one that ends while
	// nobody listens. Whoever uses OnExit to finish executors early still
	// needs recover's periodic pass for those.
	OnExit func(assignmentID string)
}

// InheritedEnv is the environment a process executor starts from (Config's
// Env): environ without any GDR_* variable, so that no configuration of ours
// (a registration token, a webhook secret, a key) reaches a job.
func InheritedEnv(environ []string) []string {
	var env []string
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "GDR_") {
			env = append(env, kv)
		}
	}
	return env
}

// Backend is the process backend.
type Backend struct {
	cfg Config
}

// New returns the backend of cfg, or an error naming what is missing.
func New(cfg Config) (*Backend, error) {
	if cfg.SVIDTTL == 0 {
		cfg.SVIDTTL = DefaultSVIDTTL
	}
	switch {
	case cfg.Dir == "":
		return nil, errors.New("process backend: no executor directory")
	case cfg.Runner == "":
		return nil, errors.New("process backend: no runner binary")
	case cfg.Keys.Runner == "" || cfg.Keys.AssignmentID == "":
		return nil, errors.New("process backend: no metadata keys")
	case cfg.TrustDomain.IsZero():
		return nil, errors.New("process backend: no trust domain")
	case cfg.Minter == nil:
		return nil, errors.New("process backend: no SVID minter: a process executor has no other identity")
	case cfg.SVIDTTL < 0:
		return nil, fmt.Errorf("process backend: SVID TTL %s is negative", cfg.SVIDTTL)
	case !slices.ContainsFunc(cfg.Pools, serves):
		return nil, errors.New("process backend: no runner pool uses the process backend")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("process backend: executor directory %s: %w", cfg.Dir, err)
	}
	return &Backend{cfg: cfg}, nil
}

// serves reports whether p is a pool of this backend.
func serves(p runnerpool.Pool) bool { return p.Backend == taskassignment.BackendProcess }

// record is an executor's metadata file.
type record struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	PID         int               `json:"pid"`
	// Start is the process's start time in clock ticks since boot
	// (/proc/<pid>/stat field 22): with the PID, it tells our process from
	// a later one that reused the PID.
	Start uint64 `json:"start"`
}

func (b *Backend) dir(id string) string     { return filepath.Join(b.cfg.Dir, id) }
func (b *Backend) meta(id string) string    { return filepath.Join(b.dir(id), "executor.json") }
func (b *Backend) status(id string) string  { return filepath.Join(b.dir(id), "status") }
func (b *Backend) logFile(id string) string { return filepath.Join(b.dir(id), "runner.log") }

// Find returns the executor of the assignment, or nil.
func (b *Backend) Find(_ context.Context, assignmentID string) (*executor.Executor, error) {
	rec, err := b.read(assignmentID)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return b.executor(assignmentID, rec), nil
}

func (b *Backend) read(id string) (record, error) {
	data, err := os.ReadFile(b.meta(id))
	if err != nil {
		return record{}, err
	}
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil {
		return record{}, fmt.Errorf("executor %s: metadata is not JSON", id)
	}
	return rec, nil
}

// executor observes the process: its status file, else whether it lives.
func (b *Backend) executor(id string, rec record) *executor.Executor {
	e := &executor.Executor{Name: rec.Name, IdentityTarget: "local", Phase: executor.PhaseRunning}
	if data, err := os.ReadFile(b.status(id)); err == nil {
		if code, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && code == 0 {
			e.Phase = executor.PhaseSucceeded
		} else {
			e.Phase = executor.PhaseFailed
		}
		return e
	}
	if rec.PID == 0 {
		e.Phase = executor.PhasePending
		return e
	}
	if !alive(rec.PID, rec.Start) {
		// Gone without a status: killed, or crashed.
		e.Phase = executor.PhaseFailed
	}
	return e
}

// Create starts the runner for a with spec's environment, and records it
// before it starts: a crash between the two leaves a record without a
// process, which Find reports pending and Create starts.
//
// A runner binary that does not exist or cannot be executed, an assignment
// of another backend or of a pool that is not a process pool of Config.Pools,
// and an identity outside the trust domain are
// executor.Permanent errors: the next delivery would fail the same way.
// The record written before such a failure is an executor without a process
// (Find: pending), which whoever fails the task deletes.
func (b *Backend) Create(ctx context.Context, a taskassignment.Assignment, spec executor.LaunchSpec) (*executor.Executor, error) {
	if a.Backend != taskassignment.BackendProcess {
		return nil, executor.Permanent(fmt.Errorf("process backend: assignment %s is for backend %q", a.ID, a.Backend))
	}
	if p, err := b.cfg.Pools.Get(a.Task.Pool); err != nil || !serves(p) {
		return nil, executor.Permanent(fmt.Errorf("process backend: assignment %s: runner pool %q is not a process pool of this installation", a.ID, a.Task.Pool))
	}
	rec, err := b.read(a.ID)
	switch {
	case err == nil && rec.PID != 0:
		return b.executor(a.ID, rec), nil
	case err == nil, errors.Is(err, fs.ErrNotExist):
	default:
		return nil, err
	}
	rec = record{Name: "process-" + a.ID, Labels: spec.Metadata.Labels, Annotations: spec.Metadata.Annotations}
	if err := os.MkdirAll(b.dir(a.ID), 0o700); err != nil {
		return nil, err
	}
	if err := b.write(a.ID, rec); err != nil {
		return nil, err
	}
	env := append([]string(nil), b.cfg.Env...)
	for k, v := range spec.Environment {
		if k == bootstrap.EnvJobImage {
			continue // a process runs no image: `container:` jobs are refused by the runner
		}
		env = append(env, k+"="+v)
	}
	id, err := spiffeid.FromString(a.Identity.SPIFFEID)
	if err != nil || !id.MemberOf(b.cfg.TrustDomain) {
		return nil, executor.Permanent(fmt.Errorf("executor %s: SPIFFE ID %q is not in trust domain %s", a.ID, a.Identity.SPIFFEID, b.cfg.TrustDomain))
	}
	svidEnv, err := bootstrap.SVIDEnvironment(ctx, b.cfg.Minter, id, b.cfg.SVIDTTL)
	if err != nil {
		return nil, fmt.Errorf("executor %s: %w", a.ID, err)
	}
	for k, v := range svidEnv {
		env = append(env, k+"="+v)
	}
	env = append(env, "GDR_STATUS_FILE="+b.status(a.ID), "GDR_WORK_DIR="+filepath.Join(b.dir(a.ID), "work"))
	logf, err := os.OpenFile(b.logFile(a.ID), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(b.cfg.Runner, b.cfg.RunnerArgs...)
	cmd.Env = env
	cmd.Dir = b.dir(a.ID)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: it outlives us, and Delete ends all of it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		err = fmt.Errorf("start the runner of %s: %w", a.ID, err)
		if cannotExec(err) {
			err = executor.Permanent(err)
		}
		return nil, err
	}
	rec.PID = cmd.Process.Pid
	rec.Start = startTime(rec.PID)
	err = b.write(a.ID, rec)
	// Reap it when it ends while we run (after a restart, init does), and
	// not before its PID is recorded: until then Find would call a child
	// that died without a status pending, not failed, when OnExit asks.
	go b.reap(cmd, a.ID)
	if err != nil {
		return nil, err
	}
	return b.executor(a.ID, rec), nil
}

// cannotExec reports whether starting a process failed because of its
// binary: missing, not executable, or not a program.
func cannotExec(err error) bool {
	return errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) ||
		errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOEXEC)
}

// reap waits for an executor's process to end, then tells OnExit.
func (b *Backend) reap(cmd *exec.Cmd, assignmentID string) {
	_ = cmd.Wait()
	if b.cfg.OnExit != nil {
		b.cfg.OnExit(assignmentID)
	}
}

func (b *Backend) write(id string, rec record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp := b.meta(id) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, b.meta(id))
}

// BindIdentity checks that the executor was created for this identity: its
// SVID was minted at Create from the same record.
func (b *Backend) BindIdentity(_ context.Context, e *executor.Executor, id taskidentity.Identity) error {
	assignmentID := strings.TrimPrefix(e.Name, "process-")
	rec, err := b.read(assignmentID)
	if err != nil {
		return err
	}
	if rec.Annotations[b.cfg.Keys.SPIFFEID] != id.SPIFFEID {
		return fmt.Errorf("executor %s was created for another identity", e.Name)
	}
	return nil
}

// deletedPrefix names an executor directory being deleted: Delete renames
// the directory to it first (one atomic step), then removes it.
const deletedPrefix = ".deleted-"

// Delete ends the executor's process group and removes its files.
//
// Invariant: at every moment the executor's directory is whole (its
// metadata included, so the next recover pass finds it and deletes it
// again) or gone from its name: it is renamed to deletedPrefix+ID before
// anything in it is removed, so a crash mid-Delete leaves no files without
// their metadata, which RecoverAssignments would never see again; what such
// a crash leaves under the deleted name, RecoverAssignments removes.
func (b *Backend) Delete(_ context.Context, e *executor.Executor) error {
	assignmentID := strings.TrimPrefix(e.Name, "process-")
	rec, err := b.read(assignmentID)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil && rec.PID != 0 && alive(rec.PID, rec.Start) {
		_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
	}
	gone := filepath.Join(b.cfg.Dir, deletedPrefix+assignmentID)
	if err := os.RemoveAll(gone); err != nil { // an earlier Delete's, cut short
		return fmt.Errorf("remove executor %s: %w", e.Name, err)
	}
	if err := os.Rename(b.dir(assignmentID), gone); err != nil {
		return fmt.Errorf("remove executor %s: %w", e.Name, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("remove executor %s: %w", e.Name, err)
	}
	return nil
}

// RecoverAssignments rebuilds the assignment of every executor, and
// removes what a Delete cut short left (see Delete).
func (b *Backend) RecoverAssignments(ctx context.Context) ([]taskassignment.Assignment, error) {
	entries, err := os.ReadDir(b.cfg.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []taskassignment.Assignment
	for _, ent := range entries {
		if !ent.IsDir() {
			continue
		}
		if strings.HasPrefix(ent.Name(), deletedPrefix) { // a Delete cut short
			if err := os.RemoveAll(filepath.Join(b.cfg.Dir, ent.Name())); err != nil && b.cfg.OnCorrupt != nil {
				b.cfg.OnCorrupt(ent.Name(), fmt.Errorf("remove a deleted executor's files: %w", err))
			}
			continue
		}
		a, found, err := b.RecoverAssignment(ctx, ent.Name())
		switch {
		case err != nil:
			if b.cfg.OnCorrupt != nil {
				b.cfg.OnCorrupt(ent.Name(), err)
			}
		case found:
			out = append(out, a)
		}
	}
	return out, nil
}

// RecoverAssignment rebuilds the assignment of one executor from its
// metadata; found is false when it has none (never created, or deleted).
func (b *Backend) RecoverAssignment(_ context.Context, assignmentID string) (taskassignment.Assignment, bool, error) {
	rec, err := b.read(assignmentID)
	if errors.Is(err, fs.ErrNotExist) {
		return taskassignment.Assignment{}, false, nil
	}
	if err != nil {
		return taskassignment.Assignment{}, false, err
	}
	a, err := b.cfg.Keys.FromMetadata(rec.Labels, rec.Annotations, b.cfg.TrustDomain)
	if err != nil {
		return taskassignment.Assignment{}, false, fmt.Errorf("executor %s: %w", assignmentID, err)
	}
	if a.ID != assignmentID {
		return taskassignment.Assignment{}, false, fmt.Errorf("executor %s holds assignment %s", assignmentID, a.ID)
	}
	return a, true, nil
}

// alive reports whether pid runs and is the process that started at start.
func alive(pid int, start uint64) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	st := startTime(pid)
	if st == 0 || (start != 0 && st != start) {
		return false
	}
	// A zombie (exited, not yet reaped) is not alive.
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 && s[i+2] == 'Z' {
		return false
	}
	return true
}

// startTime reads a process's start time (clock ticks since boot), 0 if
// unknown.
func startTime(pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); start time is field 22.
	if len(fields) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(fields[19], 10, 64)
	return v
}
