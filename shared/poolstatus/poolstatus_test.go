package poolstatus

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// A report of a real queue: two tasks of linux in flight, one started;
// gpu has none; the pod consumer is read, the process one does not exist.
func TestRead(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	env.OpenConsumer(t, taskassignment.BackendPod, 3)
	ctx := t.Context()
	taskCtx, err := structpb.NewStruct(map[string]any{"server_url": "https://gitea.example.org/", "repository": "alice/repo",
		"run_id": "42", "token": "task-token-s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"linux-1", "linux-2", "other-3"} {
		if err := env.Payloads.Put(ctx, id, &runnerv1.Task{Id: 1, Context: taskCtx, Secrets: map[string]string{"GITEA_TOKEN": "task-token-s3cret"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Payloads.MarkStarted(ctx, "linux-2"); err != nil {
		t.Fatal(err)
	}
	pools := runnerpool.Pools{
		{Name: "linux", Backend: taskassignment.BackendPod, Capacity: 3},
		{Name: "gpu", Backend: taskassignment.BackendProcess, Capacity: 1},
	}
	consumers := func(ctx context.Context, stream, name string) (Backlog, error) {
		c, err := env.JetStream.Consumer(ctx, stream, name)
		if err != nil {
			return Backlog{}, err
		}
		return Backlog{Pending: c.CachedInfo().NumPending, AckPending: uint64(c.CachedInfo().NumAckPending)}, nil
	}
	now := time.Now().Add(time.Minute)
	executors := map[taskassignment.BackendKind]Executors{taskassignment.BackendPod: findExecutors{"linux-2": {Name: "gdr-linux-2", Phase: executor.PhaseRunning}}}
	r, err := Read(ctx, Source{Payloads: env.Payloads, Tasks: env.Payloads, Executors: executors, Consumers: consumers, Stream: env.Queue.Stream()}, pools, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Pools) != 2 {
		t.Fatalf("pools = %+v", r.Pools)
	}
	linux, gpu := r.Pools[0], r.Pools[1]
	if linux.InFlight != 2 || linux.Started != 1 || linux.Waiting != 1 || linux.Queued != 0 || linux.Capacity != 3 ||
		time.Duration(linux.OldestWaiting) < 50*time.Second || len(linux.Tasks) != 2 {
		t.Errorf("linux = %+v", linux)
	}
	for _, task := range linux.Tasks {
		if task.URL != "https://gitea.example.org/alice/repo/actions/runs/42" {
			t.Errorf("task %s URL = %q", task.Assignment, task.URL)
		}
		if want := map[string]string{"linux-1": PhaseWaiting, "linux-2": PhaseStarted}[task.Assignment]; task.Phase != want {
			t.Errorf("task %s phase = %q, want %q", task.Assignment, task.Phase, want)
		}
		if want := map[string]string{"linux-2": "gdr-linux-2"}[task.Assignment]; task.Executor != want {
			t.Errorf("task %s executor = %q, want %q", task.Assignment, task.Executor, want)
		}
	}
	if gpu.InFlight != 0 || gpu.Queued != -1 || len(gpu.Tasks) != 0 || gpu.OldestWaiting != 0 {
		t.Errorf("gpu = %+v", gpu)
	}
	var table, js bytes.Buffer
	if err := r.Write(&table, "table"); err != nil {
		t.Fatal(err)
	}
	if err := r.Write(&js, "json"); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{table.String(), js.String()} {
		if strings.Contains(out, "s3cret") {
			t.Fatalf("the report shows the task's token:\n%s", out)
		}
	}
	if !strings.Contains(table.String(), "linux-1") || !strings.Contains(table.String(), "POOL") || !strings.Contains(table.String(), "gdr-linux-2 (running)") {
		t.Errorf("table:\n%s", table.String())
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Pools[0].OldestWaiting != Duration(time.Duration(linux.OldestWaiting).Round(time.Second)) {
		t.Fatalf("JSON does not read back (%v): %+v\n%s", err, back, js.String())
	}
}

// Nothing in flight is a report too: every pool at zero.
// A paused pool says so, in the table (CLAIMS) and the JSON.
func TestReadPaused(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	r, err := Read(t.Context(), Source{Payloads: env.Payloads}, runnerpool.Pools{{Name: "linux", Backend: "pod", Capacity: 2, Paused: true}, {Name: "gpu", Backend: "pod", Capacity: 1}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var table, js bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(table.String(), "\n")
	if !strings.HasSuffix(strings.TrimSpace(lines[0]), "CLAIMS") || !strings.HasSuffix(strings.TrimSpace(lines[1]), "paused") || !strings.HasSuffix(strings.TrimSpace(lines[2]), "on") {
		t.Fatalf("table:\n%s", table.String())
	}
	if !strings.Contains(js.String(), `"paused": true`) || !strings.Contains(js.String(), `"paused": false`) {
		t.Fatalf("JSON: %s", js.String())
	}
}

func TestReadEmpty(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	r, err := Read(t.Context(), Source{Payloads: env.Payloads}, runnerpool.Pools{{Name: "linux", Backend: "pod", Capacity: 2}}, time.Now())
	if err != nil || len(r.Pools) != 1 || r.Pools[0].InFlight != 0 || r.Pools[0].Queued != -1 {
		t.Fatalf("Read() = %+v, %v", r, err)
	}
	var out bytes.Buffer
	if err := r.Write(&out, "yaml"); err == nil {
		t.Fatal("an unknown format was accepted")
	}
}

// findExecutors is a backend of fixed executors, by assignment ID.
type findExecutors map[string]*executor.Executor

func (f findExecutors) Find(_ context.Context, id string) (*executor.Executor, error) {
	return f[id], nil
}

// waitingExecutors are fixed executors whose backend says why the pending
// ones wait.
type waitingExecutors struct {
	findExecutors
	why map[string]string
}

func (w waitingExecutors) WaitReason(_ context.Context, id string) (string, error) {
	return w.why[id], nil
}

// A waiting task says why: its pending executor's reason from the backend
// (Waits), or, with no executor yet, what its backend's queue holds.
func TestReadSaysWhyATaskWaits(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	env.OpenConsumer(t, taskassignment.BackendPod, 3)
	ctx := t.Context()
	for _, id := range []string{"linux-1", "linux-2", "linux-3"} {
		if err := env.Payloads.Put(ctx, id, &runnerv1.Task{Id: 1}); err != nil {
			t.Fatal(err)
		}
	}
	const unschedulable = "Unschedulable: 0/1 nodes are available: 1 Insufficient cpu."
	ex := waitingExecutors{
		findExecutors: findExecutors{"linux-2": {Name: "gdr-linux-2", Phase: executor.PhasePending},
			"linux-3": {Name: "gdr-linux-3", Phase: executor.PhaseFailed, Reason: "container runner: ErrImagePull"}},
		why: map[string]string{"linux-2": unschedulable, "linux-3": "must not be asked: it failed"},
	}
	src := Source{Payloads: env.Payloads, Executors: map[taskassignment.BackendKind]Executors{taskassignment.BackendPod: ex},
		Consumers: func(ctx context.Context, stream, name string) (Backlog, error) {
			c, err := env.JetStream.Consumer(ctx, stream, name)
			if err != nil {
				return Backlog{}, err
			}
			return Backlog{Pending: c.CachedInfo().NumPending, AckPending: uint64(c.CachedInfo().NumAckPending)}, nil
		}, Stream: env.Queue.Stream()}
	r, err := Read(ctx, src, runnerpool.Pools{{Name: "linux", Backend: taskassignment.BackendPod, Capacity: 3}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"linux-1": "no executor yet: the pod queue holds 0 undelivered, 0 delivered and unsettled",
		"linux-2": unschedulable,
		"linux-3": "container runner: ErrImagePull",
	}
	for _, task := range r.Pools[0].Tasks {
		if task.Reason != want[task.Assignment] {
			t.Errorf("task %s reason = %q, want %q", task.Assignment, task.Reason, want[task.Assignment])
		}
	}
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"gdr-linux-2 (pending): " + unschedulable, "- (no executor yet: the pod queue holds 0"} {
		if !strings.Contains(table.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, table.String())
		}
	}
}
