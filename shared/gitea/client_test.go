package gitea

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err         error
		wantCode    connect.Code
		wantMessage string
		retryable   bool
	}{
		{connect.NewError(connect.CodeUnknown, errors.New("rpc error: code = Unauthenticated desc = unregistered runner")),
			connect.CodeUnauthenticated, "unregistered runner", false},
		{connect.NewError(connect.CodeUnknown, errors.New("rpc error: code = Internal desc = update task: invalid runner for task")),
			connect.CodeInternal, "update task: invalid runner for task", false},
		{connect.NewError(connect.CodeUnknown, errors.New("rpc error: code = AlreadyExists desc = log file has been archived")),
			connect.CodeAlreadyExists, "log file has been archived", false},
		{connect.NewError(connect.CodeUnknown, errors.New("runner registration token not found")),
			connect.CodeUnknown, "runner registration token not found", false},
		{connect.NewError(connect.CodeUnavailable, errors.New("dial tcp 127.0.0.1:1: connect: connection refused")),
			connect.CodeUnavailable, "dial tcp 127.0.0.1:1: connect: connection refused", true},
		{connect.NewError(connect.CodeUnknown, errors.New("rpc error: code = NotACode desc = x")),
			connect.CodeUnknown, "rpc error: code = NotACode desc = x", false},
	} {
		err := classify(context.Background(), "UpdateTask", tc.err)
		var e *Error
		if !errors.As(err, &e) || e.Code != tc.wantCode || e.Message != tc.wantMessage || e.Retryable() != tc.retryable {
			t.Errorf("classify(%v) = %#v, want code %v message %q retryable %v", tc.err, err, tc.wantCode, tc.wantMessage, tc.retryable)
		}
		if CodeOf(fmt.Errorf("wrapped: %w", err)) != tc.wantCode {
			t.Errorf("CodeOf(wrapped %v) = %v", err, CodeOf(err))
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("classify(%v) does not wrap the original", tc.err)
		}
	}
	if classify(context.Background(), "Declare", nil) != nil || CodeOf(nil) != 0 || CodeOf(errors.New("x")) != connect.CodeUnknown {
		t.Fatal("nil or foreign errors misclassified")
	}
}

// stoppingGitea answers FetchTask as Gitea v1.27 does for a call in flight when it
// shuts down (seen on the real one: "canceled: context canceled"), or, with hold, holds
// the call until the caller gives up.
type stoppingGitea struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	hold bool
}

func (g stoppingGitea) FetchTask(ctx context.Context, _ *connect.Request[runnerv1.FetchTaskRequest]) (*connect.Response[runnerv1.FetchTaskResponse], error) {
	if g.hold {
		<-ctx.Done()
	}
	return nil, connect.NewError(connect.CodeCanceled, context.Canceled)
}

// A call Gitea cancels while the caller still waits is Gitea going away: unavailable and
// retryable, as the refused connections after it are, so that an outage is one cause (one
// warning in local mode, a retry in the reporter); a call the caller cancels is its own
// and stays canceled.
func TestCanceledByGitea(t *testing.T) {
	c, _ := fakeGitea(t, stoppingGitea{}, Credentials{UUID: "u", Token: "t"})
	_, err := c.FetchTask(context.Background())
	var e *Error
	if !errors.As(err, &e) || e.Code != connect.CodeUnavailable || !e.Retryable() ||
		!strings.Contains(e.Message, "Gitea ended the call before answering") || !wraps(err, connect.CodeCanceled) {
		t.Fatalf("FetchTask canceled by Gitea = %#v, want unavailable and retryable, wrapping the canceled answer", err)
	}
	t.Logf("canceled by Gitea: %v", err)

	c, _ = fakeGitea(t, stoppingGitea{hold: true}, Credentials{UUID: "u", Token: "t"})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	_, err = c.FetchTask(ctx)
	if !errors.As(err, &e) || e.Code != connect.CodeCanceled || e.Retryable() {
		t.Fatalf("FetchTask canceled by its caller = %#v, want canceled, not retryable", err)
	}
}

// wraps reports whether err wraps a Connect error of code.
func wraps(err error, code connect.Code) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Code() == code
}

// TestErrTaskGone: the answers of Gitea v1.27 about a task it no longer has
// for this registration (routers/api/actions/runner: UpdateTask,
// UpdateLog) are taskassignment.ErrTaskGone; a transport failure, an unregistered runner or
// another call's not-found are not.
func TestErrTaskGone(t *testing.T) {
	gitea := func(code, desc string) error {
		return connect.NewError(connect.CodeUnknown, errors.New("rpc error: code = "+code+" desc = "+desc))
	}
	for _, tc := range []struct {
		op   string
		err  error
		gone bool
	}{
		{"UpdateTask", gitea("Internal", "update task: resource does not exist"), true},
		{"UpdateTask", gitea("Internal", "update task: invalid runner for task"), true},
		{"UpdateLog", gitea("Internal", "get task: task with id 7: resource does not exist"), true},
		{"UpdateLog", gitea("Internal", "invalid runner for task"), true},
		{"UpdateTask", connect.NewError(connect.CodeNotFound, errors.New("no such task")), true},
		{"UpdateTask", gitea("Internal", "update task: database is locked"), false},
		{"UpdateTask", gitea("Unauthenticated", "unregistered runner"), false},
		{"UpdateTask", connect.NewError(connect.CodeUnavailable, errors.New("connection refused")), false},
		{"FetchTask", gitea("Internal", "pick task: resource does not exist"), false},
	} {
		err := fmt.Errorf("task 7: %w", classify(context.Background(), tc.op, tc.err))
		if got := errors.Is(err, taskassignment.ErrTaskGone); got != tc.gone {
			t.Errorf("%s %v: errors.Is(taskassignment.ErrTaskGone) = %v, want %v", tc.op, tc.err, got, tc.gone)
		}
	}
}

// fakeGitea serves h as Gitea's runner API (under /api/actions) for the
// test, and returns a client of it with creds.
func fakeGitea(t *testing.T, h runnerv1connect.RunnerServiceHandler, creds Credentials) (*Client, *httptest.Server) {
	t.Helper()
	mux := http.NewServeMux()
	path, handler := runnerv1connect.NewRunnerServiceHandler(h)
	mux.Handle("/api/actions"+path, http.StripPrefix("/api/actions", handler))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := NewClient(srv.URL+"/", srv.Client(), creds)
	if err != nil {
		t.Fatal(err)
	}
	return c, srv
}

// goneGitea answers every UpdateTask as Gitea 1.27 does for a task whose
// repository was deleted.
type goneGitea struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
}

func (goneGitea) UpdateTask(context.Context, *connect.Request[runnerv1.UpdateTaskRequest]) (*connect.Response[runnerv1.UpdateTaskResponse], error) {
	return nil, connect.NewError(connect.CodeUnknown, errors.New("rpc error: code = Internal desc = update task: resource does not exist"))
}

// A task Gitea no longer has is over: recover deletes its executor and
// payload instead of failing on it every pass.
func TestTerminalOfAGoneTask(t *testing.T) {
	c, _ := fakeGitea(t, goneGitea{}, Credentials{UUID: "u", Token: "t"})
	if over, err := (TaskState{Client: c}).Terminal(context.Background(), 7); err != nil || !over {
		t.Fatalf("Terminal of a gone task = %v, %v; want over", over, err)
	}
}

// fakeRunnerService records headers and answers like Gitea does.
type fakeRunnerService struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	headers http.Header
}

func (f *fakeRunnerService) Declare(_ context.Context, req *connect.Request[runnerv1.DeclareRequest]) (*connect.Response[runnerv1.DeclareResponse], error) {
	f.headers = req.Header().Clone()
	if req.Header().Get("x-runner-token") != "tok-123" {
		return nil, connect.NewError(connect.CodeUnknown, errors.New("rpc error: code = Unauthenticated desc = unregistered runner"))
	}
	return connect.NewResponse(&runnerv1.DeclareResponse{}), nil
}

func TestClientAuthenticatesEveryCall(t *testing.T) {
	fake := &fakeRunnerService{}
	c, srv := fakeGitea(t, fake, Credentials{UUID: "uuid-1", Token: "tok-123"})
	if err := c.Declare(context.Background(), []string{"ubuntu-latest"}); err != nil {
		t.Fatal(err)
	}
	if fake.headers.Get("x-runner-uuid") != "uuid-1" {
		t.Fatalf("headers = %v", fake.headers)
	}
	bad, _ := NewClient(srv.URL, srv.Client(), Credentials{UUID: "uuid-1", Token: "wrong"})
	err := bad.Declare(context.Background(), nil)
	if CodeOf(err) != connect.CodeUnauthenticated || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("Declare with a wrong token: %v", err)
	}
}

func TestNewClientRejects(t *testing.T) {
	for _, tc := range []struct {
		url   string
		creds Credentials
	}{
		{"http://127.0.0.1:3000/", Credentials{UUID: "u"}},
		{"127.0.0.1:3000", Credentials{UUID: "u", Token: "t"}},
		{"http://admin:pw@127.0.0.1:3000/", Credentials{UUID: "u", Token: "t"}},
	} {
		if _, err := NewClient(tc.url, nil, tc.creds); err == nil {
			t.Errorf("NewClient(%q) succeeded", tc.url)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("error shows the password: %v", err)
		}
	}
}

func TestFileStore(t *testing.T) {
	s := FileStore{Path: filepath.Join(t.TempDir(), "state", "linux.json")}
	if _, err := s.Load(); !errors.Is(err, ErrNoCredentials) {
		t.Fatalf("Load of a missing file: %v", err)
	}
	want := Credentials{ID: 3, UUID: "uuid-3", Token: "secret-token-3", Name: "linux"}
	if err := s.Save(want); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil || got != want {
		t.Fatalf("Load() = %+v, %v", got, err)
	}
	info, err := os.Stat(s.Path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, %v", info.Mode(), err)
	}
	if err := os.WriteFile(s.Path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("Load of a corrupt file: %v", err)
	}
}

func TestTokenNeverPrints(t *testing.T) {
	c := Credentials{UUID: "u", Token: "secret-token"}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "creds", c, "token", c.Token)
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%+v %#v %s %v", c, c, c.Token, c.Token), logged.String()} {
		if strings.Contains(s, "secret-token") {
			t.Fatalf("token printed: %s", s)
		}
	}
}

// versionedGitea answers FetchTask as Gitea does with tasks versions: no
// task for a runner that sends the latest version, else the next queued
// task (if any) and the latest version.
type versionedGitea struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	latest int64
	queued []int64
	sent   []int64 // the tasks_version of every request
	looked int     // requests on which it looked for a task
}

func (g *versionedGitea) FetchTask(_ context.Context, req *connect.Request[runnerv1.FetchTaskRequest]) (*connect.Response[runnerv1.FetchTaskResponse], error) {
	g.sent = append(g.sent, req.Msg.GetTasksVersion())
	res := &runnerv1.FetchTaskResponse{TasksVersion: g.latest}
	if req.Msg.GetTasksVersion() != g.latest {
		g.looked++
		if len(g.queued) > 0 {
			res.Task = &runnerv1.Task{Id: g.queued[0]}
			g.queued = g.queued[1:]
		}
	}
	return connect.NewResponse(res), nil
}

// Polling sends back the version Gitea answered, so an idle Gitea answers
// from its counter; a new version or a claimed task makes the next call look.
func TestFetchTaskSendsTheTasksVersion(t *testing.T) {
	g := &versionedGitea{latest: 5, queued: []int64{11}}
	c, _ := fakeGitea(t, g, Credentials{UUID: "u", Token: "t"})
	ctx := context.Background()
	fetch := func() int64 {
		t.Helper()
		task, err := c.FetchTask(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return task.GetId()
	}
	if id := fetch(); id != 11 { // first call looks: version 0
		t.Fatalf("first fetch = task %d, want 11", id)
	}
	if id := fetch(); id != 0 { // after a task it looks again, finds none
		t.Fatalf("second fetch = task %d", id)
	}
	for range 3 { // idle: answered from the counter
		if id := fetch(); id != 0 {
			t.Fatalf("idle fetch = task %d", id)
		}
	}
	g.latest, g.queued = 6, []int64{12} // a job is queued: Gitea bumps its version
	if id := fetch(); id != 12 {
		t.Fatalf("fetch after a new version = task %d, want 12", id)
	}
	if want := []int64{0, 0, 5, 5, 5, 5}; !slices.Equal(g.sent, want) || g.looked != 3 {
		t.Fatalf("sent versions %v (looked %d times), want %v (3 looks)", g.sent, g.looked, want)
	}
}
