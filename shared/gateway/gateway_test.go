package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

// recordingGitea is a pool registration that records what reaches Gitea.
type recordingGitea struct {
	mu    sync.Mutex
	tasks []int64
	logs  []int64
	fail  error
	// results are the tasks Gitea has ended, with their result.
	results map[int64]runnerv1.Result
}

func (r *recordingGitea) UpdateTask(_ context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tasks = append(r.tasks, req.GetState().GetId())
	if r.fail != nil {
		return nil, r.fail
	}
	if result := req.GetState().GetResult(); result != runnerv1.Result_RESULT_UNSPECIFIED {
		if r.results == nil {
			r.results = map[int64]runnerv1.Result{}
		}
		r.results[req.GetState().GetId()] = result
	}
	return &runnerv1.UpdateTaskResponse{State: &runnerv1.TaskState{Id: req.GetState().GetId(), Result: r.results[req.GetState().GetId()]}}, nil
}

func (r *recordingGitea) UpdateLog(_ context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, req.GetTaskId())
	if r.fail != nil {
		return nil, r.fail
	}
	return &runnerv1.UpdateLogResponse{AckIndex: req.GetIndex() + int64(len(req.GetRows()))}, nil
}

type fixture struct {
	reads    *countingPayloads // what the gateway reads of the payloads
	url      string
	ca       *svidca.CA
	boot     *bootstrap.Bootstrap
	gitea    *recordingGitea
	payloads *assignmentqueue.Payloads
}

func start(t *testing.T) fixture { return startWith(t, nil) }

// startWith starts a gateway that change, if set, completes before it serves.
func startWith(t testing.TB, change func(*Gateway)) fixture {
	t.Helper()
	ctx := context.Background()
	ca, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	payloads := jetstreamenv.NewQueue(t).Payloads
	boot, err := bootstrap.New(bytes.Repeat([]byte{6}, 32), "https://unused.example.org", spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingGitea{}
	reads := &countingPayloads{Payloads: payloads}
	g := &Gateway{TrustDomain: td, Pools: map[string]Forwarder{"linux": rec}, Payloads: reads, Capabilities: boot}
	if change != nil {
		change(g)
	}
	server, err := ca.Mint(spiffeid.RequireFromPath(td, "/gateway"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsconfig.MTLSServerConfig(server, ca, g.Authorizer()))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g.Handler()}
	g.TrackConnections(srv)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	for _, id := range []int64{7, 8} {
		c, _ := structpb.NewStruct(map[string]any{"repository": "alice/repo", "job": "build", "token": "tok"})
		if err := payloads.Put(ctx, "linux-"+strconv.FormatInt(id, 10), &runnerv1.Task{Id: id, Context: c}); err != nil {
			t.Fatal(err)
		}
	}
	return fixture{reads: reads, url: "https://" + ln.Addr().String(), ca: ca, boot: boot, gitea: rec, payloads: payloads}
}

func taskID(n int64) spiffeid.ID {
	return spiffeid.RequireFromPath(td, "/repo/alice/repo/task/"+strconv.FormatInt(n, 10))
}

// client returns a client holding task n's SVID and the capability of
// (assignment, capTask).
func (f fixture) client(t *testing.T, n int64, assignment string, capability string) runnerv1connect.RunnerServiceClient {
	t.Helper()
	svid, err := f.ca.Mint(taskID(n), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return NewClient(f.url, Credentials{SVID: svid, Bundle: f.ca, AssignmentID: assignment, Capability: capability}, tlsconfig.AuthorizeMemberOf(td))
}

func (f fixture) own(t *testing.T, n int64) runnerv1connect.RunnerServiceClient {
	id := "linux-" + strconv.FormatInt(n, 10)
	return f.client(t, n, id, f.boot.Capability(id, n, taskID(n).String()))
}

func code(err error) connect.Code { return connect.CodeOf(err) }

func TestOwnTaskIsServed(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	c := f.own(t, 7)
	res, err := c.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	if err != nil || res.Msg.GetTask().GetId() != 7 {
		t.Fatalf("FetchTask = %v, %v", res, err)
	}
	if started, err := f.payloads.Started(ctx, "linux-7"); err != nil || !started {
		t.Fatalf("the task was not marked started: %v, %v", started, err)
	}
	if _, err := c.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 7}})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 7, Rows: []*runnerv1.LogRow{{Content: "x"}}})); err != nil {
		t.Fatal(err)
	}
	if len(f.gitea.tasks) != 1 || len(f.gitea.logs) != 1 {
		t.Fatalf("forwarded tasks=%v logs=%v", f.gitea.tasks, f.gitea.logs)
	}
}

func TestAnotherTaskIsForbidden(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	c := f.own(t, 7)
	_, err := c.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 8}}))
	if code(err) != connect.CodePermissionDenied {
		t.Fatalf("UpdateTask of task 8 by task 7: %v", err)
	}
	_, err = c.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 8}))
	if code(err) != connect.CodePermissionDenied {
		t.Fatalf("UpdateLog of task 8 by task 7: %v", err)
	}
	if len(f.gitea.tasks)+len(f.gitea.logs) != 0 {
		t.Fatal("a forbidden call reached Gitea")
	}
	if _, err := c.Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{})); code(err) != connect.CodePermissionDenied {
		t.Fatalf("Register: %v", err)
	}
}

func TestBadCapabilityIsUnauthenticated(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	forged, _ := bootstrap.New(bytes.Repeat([]byte{9}, 32), "https://x.example.org", spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	for name, c := range map[string]runnerv1connect.RunnerServiceClient{
		"forged capability":  f.client(t, 7, "linux-7", forged.Capability("linux-7", 7, taskID(7).String())),
		"missing capability": f.client(t, 7, "linux-7", ""),
		"missing assignment": f.client(t, 7, "", f.boot.Capability("linux-7", 7, taskID(7).String())),
		// Task 8's capability is of no use with task 7's SVID, and the reverse.
		"another task's capability": f.client(t, 7, "linux-8", f.boot.Capability("linux-8", 8, taskID(8).String())),
		"stolen capability":         f.client(t, 8, "linux-7", f.boot.Capability("linux-7", 7, taskID(7).String())),
	} {
		_, err := c.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
		if code(err) != connect.CodeUnauthenticated {
			t.Errorf("%s: FetchTask = %v, want unauthenticated", name, err)
		}
		_, err = c.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 7}}))
		if code(err) != connect.CodeUnauthenticated {
			t.Errorf("%s: UpdateTask = %v, want unauthenticated", name, err)
		}
	}
	if len(f.gitea.tasks) != 0 {
		t.Fatal("an unauthenticated call reached Gitea")
	}
}

func TestHTTPStatusCodes(t *testing.T) {
	f := start(t)
	svid, _ := f.ca.Mint(taskID(7), time.Hour)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsconfig.MTLSClientConfig(svid, f.ca, tlsconfig.AuthorizeMemberOf(td))}}
	for _, tc := range []struct {
		capability string
		body       string
		want       int
	}{
		{"forged", `{"state":{"id":"7"}}`, http.StatusUnauthorized},
		{f.boot.Capability("linux-7", 7, taskID(7).String()), `{"state":{"id":"8"}}`, http.StatusForbidden},
		{f.boot.Capability("linux-7", 7, taskID(7).String()), `{"state":{"id":"7"}}`, http.StatusOK},
	} {
		req, _ := http.NewRequest(http.MethodPost, f.url+runnerv1connect.RunnerServiceUpdateTaskProcedure, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(HeaderAssignment, "linux-7")
		req.Header.Set(HeaderCapability, tc.capability)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("capability %.8q body %s: status %d, want %d", tc.capability, tc.body, resp.StatusCode, tc.want)
		}
	}
}

func TestOtherTrustDomainFailsTheHandshake(t *testing.T) {
	f := start(t)
	other := spiffeid.RequireTrustDomainFromString("evil.example.org")
	otherCA, _ := svidca.New(other)
	svid, _ := otherCA.Mint(spiffeid.RequireFromPath(other, "/repo/alice/repo/task/7"), time.Hour)
	c := NewClient(f.url, Credentials{SVID: svid, Bundle: f.ca, AssignmentID: "linux-7", Capability: "x"}, tlsconfig.AuthorizeMemberOf(td))
	_, err := c.FetchTask(context.Background(), connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	if err == nil || code(err) == connect.CodeUnauthenticated || code(err) == connect.CodePermissionDenied {
		t.Fatalf("FetchTask with a foreign SVID = %v, want a failed handshake", err)
	}
	// A non-task identity of the right trust domain fails it too.
	svid, _ = f.ca.Mint(spiffeid.RequireFromPath(td, "/dispatch"), time.Hour)
	c = NewClient(f.url, Credentials{SVID: svid, Bundle: f.ca, AssignmentID: "linux-7", Capability: "x"}, tlsconfig.AuthorizeMemberOf(td))
	if _, err := c.FetchTask(context.Background(), connect.NewRequest(&runnerv1.FetchTaskRequest{})); err == nil {
		t.Fatal("a non-task identity was served")
	}
}

func TestGiteaErrorsPassThrough(t *testing.T) {
	f := start(t)
	f.gitea.fail = &gitea.Error{Op: "UpdateLog", Code: connect.CodeAlreadyExists, Message: "log file has been archived"}
	_, err := f.own(t, 7).UpdateLog(context.Background(), connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 7}))
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeAlreadyExists || ce.Message() != "log file has been archived" {
		t.Fatalf("UpdateLog = %v", err)
	}
}

func TestFetchOfAFinishedTaskIsNotFound(t *testing.T) {
	f := start(t)
	if err := f.payloads.Delete(context.Background(), "linux-7"); err != nil {
		t.Fatal(err)
	}
	_, err := f.own(t, 7).FetchTask(context.Background(), connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	if code(err) != connect.CodeNotFound {
		t.Fatalf("FetchTask = %v", err)
	}
}

type startedRecorder struct {
	mu       sync.Mutex
	pools    []string
	waited   []time.Duration
	finished []string
}

func (r *startedRecorder) Finished(pool string, result runnerv1.Result, ran time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.finished = append(r.finished, fmt.Sprintf("%s %s %s", pool, result, ran))
}

func (r *startedRecorder) Started(pool string, waited time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pools, r.waited = append(r.pools, pool), append(r.waited, waited)
}

// The Observer hears how long a task waited from its claim (its payload
// stored) to its executor's FetchTask, by pool; a refused fetch is not
// observed.
func TestFetchTaskIsObserved(t *testing.T) {
	rec := &startedRecorder{}
	f := startWith(t, func(g *Gateway) { g.Observer = rec })
	time.Sleep(50 * time.Millisecond)
	ctx := context.Background()
	if _, err := f.own(t, 7).FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{})); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client(t, 8, "linux-8", "not-the-capability").FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{})); err == nil {
		t.Fatal("a bad capability fetched its task")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.pools) != 1 || rec.pools[0] != "linux" || rec.waited[0] < 50*time.Millisecond || rec.waited[0] > time.Minute {
		t.Fatalf("observed pools %v, waits %v; want one linux wait of at least 50ms", rec.pools, rec.waited)
	}
}

// The Observer hears of each final result Gitea accepted, by pool, with
// the run the runner reported; a state without a result, another task's
// report (403) and a span that ends before it starts are not a finish or a
// duration.
func TestFinalResultIsObserved(t *testing.T) {
	rec := &startedRecorder{}
	f := startWith(t, func(g *Gateway) { g.Observer = rec })
	ctx := context.Background()
	at := time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC)
	for _, u := range []struct {
		caller, task int64
		state        *runnerv1.TaskState
		ok           bool
	}{
		{7, 7, &runnerv1.TaskState{Id: 7}, true},
		{7, 8, &runnerv1.TaskState{Id: 8, Result: runnerv1.Result_RESULT_SUCCESS}, false},
		{7, 7, &runnerv1.TaskState{Id: 7, Result: runnerv1.Result_RESULT_FAILURE, StartedAt: timestamppb.New(at), StoppedAt: timestamppb.New(at.Add(90 * time.Second))}, true},
		{8, 8, &runnerv1.TaskState{Id: 8, Result: runnerv1.Result_RESULT_SUCCESS, StartedAt: timestamppb.New(at), StoppedAt: timestamppb.New(at.Add(-time.Hour))}, true},
	} {
		_, err := f.own(t, u.caller).UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: u.state}))
		if (err == nil) != u.ok {
			t.Fatalf("task %d reports task %d: %v", u.caller, u.task, err)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := []string{"linux RESULT_FAILURE 1m30s", "linux RESULT_SUCCESS 0s"}
	if !slices.Equal(rec.finished, want) {
		t.Fatalf("observed finishes %q, want %q", rec.finished, want)
	}
}

// A runner fetches its task again in the same executor (the container of an
// OpenSandbox sandbox on Kubernetes restarted after the runner exited): it
// gets the task while Gitea runs it (a retry after a lost answer), and is
// refused once the task has ended, so a finished job never runs twice.
func TestFetchAgainAfterTheTaskEndedIsRefused(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	c := f.own(t, 7)
	for i := range 2 {
		if res, err := c.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{})); err != nil || res.Msg.GetTask().GetId() != 7 {
			t.Fatalf("fetch %d while the task runs = %v, %v", i+1, res, err)
		}
	}
	final := &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 7, Result: runnerv1.Result_RESULT_SUCCESS}}
	if _, err := c.UpdateTask(ctx, connect.NewRequest(final)); err != nil {
		t.Fatal(err)
	}
	// The task has ended, its payload is still stored (recover has not run).
	if _, err := f.payloads.Get(ctx, "linux-7"); err != nil {
		t.Fatalf("payload of the ended task: %v", err)
	}
	_, err := f.own(t, 7).FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	if code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "has ended") {
		t.Fatalf("fetch after the task ended = %v, want FailedPrecondition", err)
	}
	// Another task, fetched for the first time, costs Gitea nothing.
	f.gitea.mu.Lock()
	before := len(f.gitea.tasks)
	f.gitea.mu.Unlock()
	if _, err := f.own(t, 8).FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{})); err != nil {
		t.Fatal(err)
	}
	f.gitea.mu.Lock()
	defer f.gitea.mu.Unlock()
	if len(f.gitea.tasks) != before {
		t.Fatalf("a first fetch asked Gitea: %v", f.gitea.tasks[before:])
	}
}

// deletingPayloads is recover ending the task while the gateway answers its executor's
// FetchTask: the payload and its marks are deleted (assignmentqueue's Delete) after the
// gateway has read the payload and before it marks the task started.
type deletingPayloads struct {
	Payloads
	deleted  atomic.Bool
	recovers func(ctx context.Context, assignmentID string) error
}

func (d *deletingPayloads) MarkStarted(ctx context.Context, assignmentID string) error {
	if err := d.recovers(ctx, assignmentID); err != nil {
		return err
	}
	d.deleted.Store(true)
	return d.Payloads.MarkStarted(ctx, assignmentID)
}

// TestFetchRacingTheEndLeavesNoMark: recover deletes a task's payload and marks between the
// gateway's read of the payload and its started mark (the fault, asserted first: the delete
// ran there and the payload is gone). The fetch is refused as over, and no started mark is left
// behind without its payload (nothing would ever delete it: recover passes over payloads).
func TestFetchRacingTheEndLeavesNoMark(t *testing.T) {
	var race *deletingPayloads
	f := startWith(t, func(g *Gateway) {
		race = &deletingPayloads{Payloads: g.Payloads}
		g.Payloads = race
	})
	race.recovers = f.payloads.Delete
	ctx := context.Background()
	_, err := f.own(t, 7).FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	if !race.deleted.Load() {
		t.Fatal("the delete did not run between the gateway's read and its mark")
	}
	if _, gone := f.payloads.Get(ctx, "linux-7"); !errors.Is(gone, taskassignment.ErrPayloadNotFound) {
		t.Fatalf("payload after the delete: %v, want not found", gone)
	}
	if code(err) != connect.CodeNotFound {
		t.Errorf("fetch racing the end = %v, want NotFound (the task is over)", err)
	}
	if started, err := f.payloads.Started(ctx, "linux-7"); err != nil || started {
		t.Fatalf("started mark after the race: %v, %v; want none left without its payload", started, err)
	}
}
