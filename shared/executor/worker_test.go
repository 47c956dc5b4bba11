package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// recorder is an in-memory Backend and TaskState that logs every call, in
// order, into one journal.
type recorder struct {
	calls     []string
	executors map[string]*Executor
	specs     map[string]LaunchSpec
	// created is what Create makes: its IdentityTarget and Phase.
	createdTarget string
	terminal      bool
	fail          map[string]error
	ended         map[string]bool // end marks (endings_test.go)
}

func newRecorder() *recorder {
	return &recorder{executors: map[string]*Executor{}, specs: map[string]LaunchSpec{}, fail: map[string]error{}}
}

func (r *recorder) Find(_ context.Context, id string) (*Executor, error) {
	r.calls = append(r.calls, "find")
	if err := r.fail["find"]; err != nil {
		return nil, err
	}
	if e, ok := r.executors[id]; ok {
		c := *e
		return &c, nil
	}
	return nil, nil
}

func (r *recorder) Create(_ context.Context, a taskassignment.Assignment, spec LaunchSpec) (*Executor, error) {
	r.calls = append(r.calls, "create")
	if err := r.fail["create"]; err != nil {
		return nil, err
	}
	e := &Executor{Name: "exec-" + a.ID, IdentityTarget: r.createdTarget, Phase: PhasePending}
	r.executors[a.ID] = e
	r.specs[a.ID] = spec
	c := *e
	return &c, nil
}

func (r *recorder) BindIdentity(_ context.Context, e *Executor, id taskidentity.Identity) error {
	r.calls = append(r.calls, "bind:"+e.IdentityTarget+":"+id.SPIFFEID)
	return r.fail["bind"]
}

func (r *recorder) RecoverAssignments(context.Context) ([]taskassignment.Assignment, error) {
	r.calls = append(r.calls, "list")
	return nil, nil
}

func (r *recorder) Delete(_ context.Context, e *Executor) error {
	r.calls = append(r.calls, "delete:"+e.Name)
	if err := r.fail["delete"]; err != nil {
		return err
	}
	for id, x := range r.executors {
		if x.Name == e.Name {
			delete(r.executors, id)
		}
	}
	return nil
}

func (r *recorder) Terminal(_ context.Context, taskID int64) (bool, error) {
	r.calls = append(r.calls, fmt.Sprintf("terminal:%d", taskID))
	return r.terminal, r.fail["terminal"]
}

func (r *recorder) Report(_ context.Context, taskID int64, e Executor) error {
	call := fmt.Sprintf("report:%d:%s", taskID, e.Phase)
	if e.Reason != "" {
		call += ":" + e.Reason
	}
	r.calls = append(r.calls, call)
	return r.fail["report"]
}

const spiffeID = "spiffe://ci.example.org/repo/alice/repo/task/42"

func fixture(t *testing.T) (Worker, *recorder, taskassignment.Assignment, *[]Event) {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	id, err := taskidentity.New(td, "alice/repo", "build", 42)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: 42, Pool: "linux"}, id)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bootstrap.New(bytes.Repeat([]byte{7}, 32), "https://gateway.example.org", spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := taskassignment.NewKeys("ci.example.org")
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	var events []Event
	w := Worker{Backend: rec, Tasks: rec, Bootstrap: b, Keys: keys, OnEvent: func(e Event) { events = append(events, e) }}
	return w, rec, a, &events
}

func (r *recorder) has(a taskassignment.Assignment, target string, phase Phase) {
	r.executors[a.ID] = &Executor{Name: "exec-" + a.ID, IdentityTarget: target, Phase: phase}
}

var errBoom = errors.New("boom")

func TestFinish(t *testing.T) {
	bind := "bind:node-1:" + spiffeID
	tests := []struct {
		name      string
		setup     func(r *recorder, a taskassignment.Assignment)
		wantDone  bool
		wantErr   bool
		wantCalls []string
		wantGone  bool // the executor no longer exists afterwards
	}{
		{"terminal with executor deletes it",
			func(r *recorder, a taskassignment.Assignment) { r.terminal = true; r.has(a, "node-1", PhaseRunning) },
			true, false, []string{"terminal:42", "find", "delete:exec-linux-42"}, true},
		{"terminal without executor is done",
			func(r *recorder, a taskassignment.Assignment) { r.terminal = true },
			true, false, []string{"terminal:42", "find", "discard:linux-42"}, true},
		// Only Accept creates: an absent executor of a task that is not over
		// is left absent (its payload is an orphan for recover).
		{"absent is not created",
			func(r *recorder, a taskassignment.Assignment) {},
			false, false, []string{"terminal:42", "find"}, true},
		{"absent is not created, even when a target would be known at once",
			func(r *recorder, a taskassignment.Assignment) { r.createdTarget = "node-1" },
			false, false, []string{"terminal:42", "find"}, true},
		{"identity target pending",
			func(r *recorder, a taskassignment.Assignment) { r.has(a, "", PhasePending) },
			false, false, []string{"terminal:42", "find"}, false},
		{"running is bound and left alone",
			func(r *recorder, a taskassignment.Assignment) { r.has(a, "node-1", PhaseRunning) },
			false, false, []string{"terminal:42", "find", bind}, false},
		{"unknown phase is not terminal",
			func(r *recorder, a taskassignment.Assignment) { r.has(a, "node-1", PhaseUnknown) },
			false, false, []string{"terminal:42", "find", bind}, false},
		{"succeeded is reported then deleted",
			func(r *recorder, a taskassignment.Assignment) { r.has(a, "node-1", PhaseSucceeded) },
			true, false, []string{"terminal:42", "find", bind, "report:42:succeeded", "delete:exec-linux-42"}, true},
		{"failed is reported then deleted",
			func(r *recorder, a taskassignment.Assignment) { r.has(a, "node-1", PhaseFailed) },
			true, false, []string{"terminal:42", "find", bind, "report:42:failed", "delete:exec-linux-42"}, true},
		{"the backend's reason reaches the report",
			func(r *recorder, a taskassignment.Assignment) {
				r.has(a, "node-1", PhaseFailed)
				r.executors[a.ID].Reason = "ImagePullBackOff"
			},
			true, false, []string{"terminal:42", "find", bind, "report:42:failed:ImagePullBackOff", "delete:exec-linux-42"}, true},
		{"report fails: no delete, not done",
			func(r *recorder, a taskassignment.Assignment) {
				r.has(a, "node-1", PhaseSucceeded)
				r.fail["report"] = errBoom
			},
			false, true, []string{"terminal:42", "find", bind, "report:42:succeeded"}, false},
		{"delete fails: not done",
			func(r *recorder, a taskassignment.Assignment) {
				r.has(a, "node-1", PhaseFailed)
				r.fail["delete"] = errBoom
			},
			false, true, []string{"terminal:42", "find", bind, "report:42:failed", "delete:exec-linux-42"}, false},
		{"terminal delete fails: not done",
			func(r *recorder, a taskassignment.Assignment) {
				r.terminal = true
				r.has(a, "node-1", PhaseRunning)
				r.fail["delete"] = errBoom
			},
			false, true, []string{"terminal:42", "find", "delete:exec-linux-42"}, false},
		{"Gitea unreachable: nothing touched",
			func(r *recorder, a taskassignment.Assignment) {
				r.has(a, "node-1", PhaseSucceeded)
				r.fail["terminal"] = errBoom
			},
			false, true, []string{"terminal:42"}, false},
		{"find fails",
			func(r *recorder, a taskassignment.Assignment) { r.fail["find"] = errBoom },
			false, true, []string{"terminal:42", "find"}, true},
		{"bind fails: no report",
			func(r *recorder, a taskassignment.Assignment) {
				r.has(a, "node-1", PhaseSucceeded)
				r.fail["bind"] = errBoom
			},
			false, true, []string{"terminal:42", "find", bind}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, rec, a, _ := fixture(t)
			tt.setup(rec, a)
			done, err := w.Finish(context.Background(), a)
			if done != tt.wantDone || (err != nil) != tt.wantErr {
				t.Fatalf("Finish() = %v, %v; want done=%v, error=%v", done, err, tt.wantDone, tt.wantErr)
			}
			if tt.wantErr && !errors.Is(err, errBoom) {
				t.Fatalf("Finish() error %v does not wrap the backend's error", err)
			}
			if !slices.Equal(rec.calls, tt.wantCalls) {
				t.Fatalf("calls = %q\nwant    %q", rec.calls, tt.wantCalls)
			}
			if _, exists := rec.executors[a.ID]; exists == tt.wantGone {
				t.Fatalf("executor exists = %v, want %v", exists, !tt.wantGone)
			}
		})
	}
}

func TestAccept(t *testing.T) {
	bind := "bind:node-1:" + spiffeID
	tests := []struct {
		name       string
		setup      func(r *recorder, a taskassignment.Assignment)
		wantOK     bool
		wantErr    bool
		wantCalls  []string
		wantEvents []EventName
	}{
		{"absent is created, target pending",
			func(r *recorder, a taskassignment.Assignment) {},
			false, false, []string{"find", "create"},
			[]EventName{EventExecutorAbsent, EventExecutorCreated, EventIdentityTargetPending}},
		{"absent is created and bound",
			func(r *recorder, a taskassignment.Assignment) { r.createdTarget = "node-1" },
			true, false, []string{"find", "create", bind},
			[]EventName{EventExecutorAbsent, EventExecutorCreated, EventIdentityBound}},
		{"found and bound, never created again",
			func(r *recorder, a taskassignment.Assignment) { r.has(a, "node-1", PhaseRunning) },
			true, false, []string{"find", bind},
			[]EventName{EventExecutorFound, EventIdentityBound}},
		{"found, target pending",
			func(r *recorder, a taskassignment.Assignment) { r.has(a, "", PhasePending) },
			false, false, []string{"find"},
			[]EventName{EventExecutorFound, EventIdentityTargetPending}},
		{"found finished executor is still only bound: reporting is Finish's job",
			func(r *recorder, a taskassignment.Assignment) { r.has(a, "node-1", PhaseSucceeded) },
			true, false, []string{"find", bind},
			[]EventName{EventExecutorFound, EventIdentityBound}},
		{"find fails",
			func(r *recorder, a taskassignment.Assignment) { r.fail["find"] = errBoom },
			false, true, []string{"find"}, nil},
		{"create fails",
			func(r *recorder, a taskassignment.Assignment) { r.fail["create"] = errBoom },
			false, true, []string{"find", "create"}, []EventName{EventExecutorAbsent}},
		{"bind fails",
			func(r *recorder, a taskassignment.Assignment) {
				r.has(a, "node-1", PhaseRunning)
				r.fail["bind"] = errBoom
			},
			false, true, []string{"find", bind}, []EventName{EventExecutorFound}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, rec, a, events := fixture(t)
			tt.setup(rec, a)
			ok, err := w.Accept(context.Background(), a)
			if ok != tt.wantOK || (err != nil) != tt.wantErr {
				t.Fatalf("Accept() = %v, %v; want ok=%v, error=%v", ok, err, tt.wantOK, tt.wantErr)
			}
			if tt.wantErr && !errors.Is(err, errBoom) {
				t.Fatalf("Accept() error %v does not wrap the backend's error", err)
			}
			if !slices.Equal(rec.calls, tt.wantCalls) {
				t.Fatalf("calls = %q\nwant    %q", rec.calls, tt.wantCalls)
			}
			var names []EventName
			for _, e := range *events {
				names = append(names, e.Name)
			}
			if !slices.Equal(names, tt.wantEvents) {
				t.Fatalf("events = %q, want %q", names, tt.wantEvents)
			}
		})
	}
}

func TestRepeatedCallsCreateOnce(t *testing.T) {
	for _, call := range []struct {
		name string
		run  func(w Worker, a taskassignment.Assignment) error
	}{
		{"Accept", func(w Worker, a taskassignment.Assignment) error {
			_, err := w.Accept(context.Background(), a)
			return err
		}},
	} {
		for _, target := range []string{"", "node-1"} {
			t.Run(call.name+"/target="+target, func(t *testing.T) {
				w, rec, a, _ := fixture(t)
				rec.createdTarget = target
				for range 3 {
					if err := call.run(w, a); err != nil {
						t.Fatal(err)
					}
				}
				if n := strings.Count(strings.Join(rec.calls, " "), "create"); n != 1 {
					t.Fatalf("%d Creates over 3 calls: %q", n, rec.calls)
				}
			})
		}
	}
}

// Finish of an absent executor whose task is not over creates nothing and
// says so with EventExecutorAbsent; it is not done (the payload is recover's
// orphan), and not an error.
func TestFinishNeverCreates(t *testing.T) {
	for _, target := range []string{"", "node-1"} {
		t.Run("target="+target, func(t *testing.T) {
			w, rec, a, events := fixture(t)
			rec.createdTarget = target
			for range 3 {
				done, err := w.Finish(context.Background(), a)
				if done || err != nil {
					t.Fatalf("Finish() = %v, %v; want not done, no error", done, err)
				}
			}
			if slices.Contains(rec.calls, "create") || len(rec.executors) != 0 {
				t.Fatalf("Finish created an executor: calls %q", rec.calls)
			}
			for _, e := range *events {
				if e.Name != EventExecutorAbsent {
					t.Fatalf("events = %+v, want only %s", *events, EventExecutorAbsent)
				}
			}
			if len(*events) != 3 {
				t.Fatalf("%d events over 3 calls, want 3 %s", len(*events), EventExecutorAbsent)
			}
		})
	}
}

func TestCreateGetsMetadataAndEnvironment(t *testing.T) {
	w, rec, a, _ := fixture(t)
	if _, err := w.Accept(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	spec := rec.specs[a.ID]
	if spec.Metadata.Labels[w.Keys.AssignmentID] != a.ID || spec.Metadata.Annotations[w.Keys.SPIFFEID] != spiffeID {
		t.Fatalf("metadata = %+v", spec.Metadata)
	}
	want, _ := w.Bootstrap.Environment(a)
	if len(spec.Environment) != len(want) || spec.Environment[bootstrap.EnvCapability] != want[bootstrap.EnvCapability] {
		t.Fatalf("environment = %v, want the bootstrap environment", spec.Environment)
	}
	for k, v := range spec.Metadata.Labels {
		if v == want[bootstrap.EnvCapability] {
			t.Fatalf("label %s carries the capability", k)
		}
	}
}

// Events must never carry an environment value, whatever happens.
func TestEventsCarryNoEnvironment(t *testing.T) {
	w, rec, a, events := fixture(t)
	env, err := w.Bootstrap.Environment(a)
	if err != nil {
		t.Fatal(err)
	}
	rec.createdTarget = "node-1"
	if _, err := w.Accept(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	rec.executors[a.ID].Phase = PhaseSucceeded
	if _, err := w.Finish(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	rec.terminal = true
	if _, err := w.Finish(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	if len(*events) < 6 {
		t.Fatalf("only %d events: %+v", len(*events), *events)
	}
	secret := env[bootstrap.EnvCapability]
	for _, e := range *events {
		if s := fmt.Sprintf("%+v %#v", e, e); strings.Contains(s, secret) {
			t.Fatalf("event %s carries the capability", s)
		}
	}
}

func TestWorkerRequiresItsParts(t *testing.T) {
	w, _, a, _ := fixture(t)
	for name, broken := range map[string]Worker{
		"no backend":   {Tasks: w.Tasks, Bootstrap: w.Bootstrap, Keys: w.Keys},
		"no bootstrap": {Backend: w.Backend, Tasks: w.Tasks, Keys: w.Keys},
		"no keys":      {Backend: w.Backend, Tasks: w.Tasks, Bootstrap: w.Bootstrap},
	} {
		if _, err := broken.Accept(context.Background(), a); err == nil {
			t.Errorf("%s: Accept succeeded", name)
		}
		if _, err := broken.Finish(context.Background(), a); err == nil {
			t.Errorf("%s: Finish succeeded", name)
		}
	}
	noTasks := w
	noTasks.Tasks = nil
	if _, err := noTasks.Finish(context.Background(), a); err == nil {
		t.Error("Finish without task state succeeded")
	}
	if _, err := w.Accept(context.Background(), taskassignment.Assignment{}); err == nil {
		t.Error("Accept of an empty assignment succeeded")
	}
}
