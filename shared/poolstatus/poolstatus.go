// Package poolstatus reports, per runner pool, what the queue holds: the
// tasks claimed and not finished (their payloads), how many of them an
// executor has started and how long the others have waited, and the
// backend consumer's queued messages. It answers "why is my job stuck?"
// from JetStream alone: reading it changes nothing.
//
// Invariants: a report never holds a task's token, secrets or workflow;
// a task's Gitea URL is built from its repository and run ID only.
package poolstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Payloads is what a report reads of the payload store
// (assignmentqueue.Payloads).
type Payloads interface {
	// Stored lists the stored payloads and when each was written.
	Stored(ctx context.Context) (map[string]time.Time, error)
	Started(ctx context.Context, assignmentID string) (bool, error)
}

// Tasks reads a stored task (assignmentqueue.Payloads.Get), for its URL;
// optional: a reader without the payload key leaves URLs out.
type Tasks interface {
	Get(ctx context.Context, assignmentID string) (*runnerv1.Task, error)
}

// Executors finds a task's executor in its backend (executor.Backend);
// optional: a reader without backend access leaves executors out.
type Executors interface {
	Find(ctx context.Context, assignmentID string) (*executor.Executor, error)
}

// Waits says why an executor that has not started its job waits
// (pod.Backend.WaitReason: the scheduler's or kubelet's reason;
// opensandbox.Backend.WaitReason: the sandbox's state). Optional: an
// Executors that implements it gives each pending executor its reason.
type Waits interface {
	WaitReason(ctx context.Context, assignmentID string) (string, error)
}

// Backlog is a durable consumer's messages: not delivered yet (Pending), and
// delivered but not settled (AckPending).
type Backlog struct {
	Pending, AckPending uint64
}

// Backlogs reads a durable consumer's backlog (metrics.ConsumerInfo.Backlogs
// over JetStream).
type Backlogs func(ctx context.Context, stream, consumer string) (Backlog, error)

// Source is where a report is read from.
type Source struct {
	Payloads Payloads
	// Tasks, when set, gives each task its Gitea URL.
	Tasks Tasks
	// Executors, when set, finds each task's executor, by backend.
	Executors map[taskassignment.BackendKind]Executors
	// Consumers and Stream give each backend's queued messages; nil leaves
	// them out.
	Consumers Backlogs
	Stream    string
}

// Phases of a task in a report.
const (
	// PhaseWaiting: claimed and stored, its executor has not fetched it yet
	// (queued in JetStream, or its executor is being created).
	PhaseWaiting = "waiting"
	// PhaseStarted: its executor fetched it and reports to Gitea.
	PhaseStarted = "started"
)

// Report is the status of every pool at one time.
type Report struct {
	Time  time.Time `json:"time"`
	Pools []Pool    `json:"pools"`
}

// Pool is one pool's status.
type Pool struct {
	Name     string `json:"name"`
	Backend  string `json:"backend"`
	Capacity int    `json:"capacity"`
	// Paused: dispatch claims no task for the pool (runnerpool.Pool.Paused).
	Paused bool `json:"paused"`
	// InFlight counts the pool's stored payloads: tasks claimed and not
	// finished; Started those an executor has fetched, Waiting the others.
	InFlight int `json:"in_flight"`
	Started  int `json:"started"`
	Waiting  int `json:"waiting"`
	// OldestWaiting is how long the oldest waiting task has waited since it
	// was claimed; zero when none waits.
	OldestWaiting Duration `json:"oldest_waiting"`
	// Queued counts the messages of the pool's backend consumer not yet
	// delivered, and AckPending those delivered to a handler and not yet
	// settled: shared by every pool of the backend. -1 when unknown.
	Queued     int    `json:"queued"`
	AckPending int    `json:"ack_pending"`
	Tasks      []Task `json:"tasks"`
}

// Task is one task in flight.
type Task struct {
	Assignment string   `json:"assignment"`
	Task       int64    `json:"task"`
	Phase      string   `json:"phase"`
	Age        Duration `json:"age"`
	// URL is the task's workflow run in Gitea, when the report could read it.
	URL string `json:"url,omitempty"`
	// Executor names the task's executor and ExecutorPhase its phase, when
	// the report could look (Source.Executors); empty executor: none yet
	// (its assignment is still queued, or being created). Reason says why a
	// failed executor failed, when its backend can tell, why a pending one
	// waits (Waits), or, for a waiting task without an executor, how many
	// messages its backend's queue holds.
	Executor      string `json:"executor,omitempty"`
	ExecutorPhase string `json:"executor_phase,omitempty"`
	Reason        string `json:"reason,omitempty"`
}

// Duration is a time.Duration that reads as "1m30s" in JSON too.
type Duration time.Duration

// MarshalJSON writes d as its String form, in whole seconds.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).Round(time.Second).String())
}

// UnmarshalJSON reads a Duration written by MarshalJSON.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Read reports pools as src holds them at now.
func Read(ctx context.Context, src Source, pools runnerpool.Pools, now time.Time) (Report, error) {
	stored, err := src.Payloads.Stored(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("pool status: %w", err)
	}
	r := Report{Time: now, Pools: []Pool{}}
	queued := map[string]*Backlog{}
	for _, p := range pools {
		pool := Pool{Name: p.Name, Backend: string(p.Backend), Capacity: p.Capacity, Paused: p.Paused, Queued: -1, AckPending: -1, Tasks: []Task{}}
		if src.Consumers != nil {
			info, ok := queued[pool.Backend]
			if !ok {
				if b, err := src.Consumers(ctx, src.Stream, pool.Backend); err == nil {
					info = &b
				} // else a backend with no consumer yet: unknown
				queued[pool.Backend] = info
			}
			if info != nil {
				pool.Queued, pool.AckPending = int(info.Pending), int(info.AckPending)
			}
		}
		for id, at := range stored {
			taskID, ok := taskOf(id, p.Name)
			if !ok {
				continue
			}
			started, err := src.Payloads.Started(ctx, id)
			if err != nil {
				return Report{}, fmt.Errorf("pool status: pool %s: %w", p.Name, err)
			}
			t := Task{Assignment: id, Task: taskID, Phase: PhaseWaiting, Age: Duration(max(now.Sub(at), 0))}
			pool.InFlight++
			if started {
				t.Phase = PhaseStarted
				pool.Started++
			} else {
				pool.Waiting++
				pool.OldestWaiting = max(pool.OldestWaiting, t.Age)
			}
			if src.Tasks != nil {
				if task, err := src.Tasks.Get(ctx, id); err == nil {
					t.URL = RunURL(task)
				}
			}
			if ex := src.Executors[p.Backend]; ex != nil {
				t.Executor, t.ExecutorPhase, t.Reason = executorOf(ctx, ex, id)
				if t.Executor == "" && !started {
					t.Reason = "no executor yet"
					if pool.Queued >= 0 {
						t.Reason += fmt.Sprintf(": the %s queue holds %d undelivered, %d delivered and unsettled", pool.Backend, pool.Queued, pool.AckPending)
					}
				}
			}
			pool.Tasks = append(pool.Tasks, t)
		}
		slices.SortFunc(pool.Tasks, func(a, b Task) int { return int(b.Age - a.Age) })
		r.Pools = append(r.Pools, pool)
	}
	return r, nil
}

// executorOf returns the name, phase and reason of assignment id's executor
// in ex, all empty when it has none or ex cannot tell; a pending executor's
// reason is why it waits, when ex says (Waits).
func executorOf(ctx context.Context, ex Executors, id string) (name, phase, reason string) {
	e, err := ex.Find(ctx, id)
	if err != nil || e == nil {
		return "", "", ""
	}
	reason = e.Reason
	if w, ok := ex.(Waits); ok && e.Phase == executor.PhasePending && reason == "" {
		if why, err := w.WaitReason(ctx, id); err == nil {
			reason = why
		}
	}
	return e.Name, string(e.Phase), reason
}

// taskOf returns the task ID of assignment id when it is one of pool's
// ("<pool>-<task ID>").
func taskOf(id, pool string) (int64, bool) {
	rest, ok := strings.CutPrefix(id, pool+"-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	return n, err == nil
}

// RunURL is the Gitea page of task's workflow run, or "" when its context
// lacks what it takes.
func RunURL(task *runnerv1.Task) string {
	f := task.GetContext().GetFields()
	server, repo, run := f["server_url"].GetStringValue(), f["repository"].GetStringValue(), f["run_id"].GetStringValue()
	if server == "" || repo == "" || run == "" {
		return ""
	}
	return strings.TrimSuffix(server, "/") + "/" + repo + "/actions/runs/" + run
}

// WriteTable writes r for a person: one line per pool, then one per task,
// its executor last (with the reason it waits or failed, the longest cell).
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tBACKEND\tCAPACITY\tIN FLIGHT\tSTARTED\tWAITING\tOLDEST WAITING\tQUEUED\tDELIVERED\tCLAIMS")
	for _, p := range r.Pools {
		claims := "on"
		if p.Paused {
			claims = "paused"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", p.Name, p.Backend, p.Capacity, p.InFlight, p.Started, p.Waiting,
			age(p.OldestWaiting, p.Waiting > 0), count(p.Queued), count(p.AckPending), claims)
	}
	var tasks []Task
	for _, p := range r.Pools {
		tasks = append(tasks, p.Tasks...)
	}
	if len(tasks) > 0 {
		fmt.Fprintln(tw, "\nASSIGNMENT\tTASK\tPHASE\tAGE\tURL\tEXECUTOR")
		for _, t := range tasks {
			executor := "-"
			if t.Executor == "" && t.Reason != "" {
				executor = "- (" + t.Reason + ")"
			}
			if t.Executor != "" {
				executor = t.Executor + " (" + t.ExecutorPhase + ")"
				if t.Reason != "" {
					executor += ": " + t.Reason
				}
			}
			url := t.URL
			if url == "" {
				url = "-"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", t.Assignment, t.Task, t.Phase, age(t.Age, true), url, executor)
		}
	}
	return tw.Flush()
}

// WriteJSON writes r for a script.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Write writes r in format: "table" or "json".
func (r Report) Write(w io.Writer, format string) error {
	switch format {
	case "table", "":
		return r.WriteTable(w)
	case "json":
		return r.WriteJSON(w)
	}
	return fmt.Errorf("output format %q: want table or json", format)
}

func age(d Duration, known bool) string {
	if !known {
		return "-"
	}
	return time.Duration(d).Round(time.Second).String()
}

func count(n int) string {
	if n < 0 {
		return "?"
	}
	return strconv.Itoa(n)
}
