package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
	"google.golang.org/protobuf/types/known/structpb"
)

// Gitea is a scripted Gitea: the runner protocol (Register, Declare,
// FetchTask, UpdateTask, UpdateLog under /api/actions) as Gitea 1.27 answers
// it (see RUNNER-PROTOCOL.md), over a queue of jobs the test fills, on
// 127.0.0.1. What it holds is the record the chaos run is judged by:
//
//   - FetchTask hands each queued job to one runner, once, the oldest first
//     whose labels are all the runner's, and honours tasks_version (no pick
//     while the runner has the latest version; queuing raises it).
//   - UpdateTask of a done task changes nothing and answers its result: the
//     first final result wins. Every final result sent is recorded, those
//     ignored included, with who sent it.
//   - UpdateLog follows Gitea's ack rule and archives on no_more.
//   - A claimed task with no UpdateTask (or writing UpdateLog) for
//     ZombieTimeout is failed by the reaper, and recorded as reaped.
//   - With faults on, a share of all calls (FaultRate) answers 500, 502,
//     503 or 429 before taking effect, from a seeded source.
//   - Every call that reaches it is recorded (CallLog): when its handler
//     started and ended, which registration made it, and to which of its
//     endpoints it came (Endpoint: each process of the fleet is given its
//     own, so the endpoint names the process); a claim keeps the call that
//     carried it.
//
// Its methods are safe for concurrent use.
type Gitea struct {
	// URL is the root URL the functions are configured with.
	URL string
	// RegistrationToken registers runners.
	RegistrationToken string

	zombieTimeout time.Duration
	faultRate     float64
	faultsOn      atomic.Bool
	calls         atomic.Int64
	faulted       atomic.Int64

	rngMu sync.Mutex
	rng   *mathrand.Rand

	connSeq atomic.Int64
	callSeq atomic.Int64

	mu      sync.Mutex
	runners map[string]*runner // by UUID
	tasks   map[int64]*task
	waiting []*task
	version int64
	nextID  int64
	callLog []*Call

	srv *http.Server
}

type runner struct {
	id                int64
	uuid, token, name string
	labels            []string
}

type task struct {
	id       int64
	labels   []string
	payload  *runnerv1.Task
	runner   int64 // 0 while the job waits
	claims   int
	claimed  time.Time // the first claim's answer
	claim    *Call     // the call of the first claim (its Answered is set once it is written)
	queuedAt time.Time
	updated  time.Time
	result   runnerv1.Result
	finals   []Final
	reaped   bool
	logRows  int64
	lastLog  string // the last log row written over the protocol
	archived bool
}

// Final is one final result sent for a task.
type Final struct {
	Result runnerv1.Result
	// Accepted is false for a result sent after the task was done, which
	// Gitea ignores.
	Accepted bool
	// By says who sent it: "protocol" (an UpdateTask over the runner
	// protocol: an executor's report forwarded by the gateway, recover's
	// report, dispatch's finalize; PID tells them apart), or "reaper".
	// ("runner", a report made in-process, is no longer sent by the run;
	// the verdict still judges it.)
	By string
	// Log is the last log row written before it over the protocol (the
	// reason a report or finalize gives), "" if none.
	Log string
	// At is when Gitea received it.
	At time.Time
	// Endpoint is the endpoint the call that sent it over the protocol came
	// to (see Call), "" if none of Endpoint's or not sent over the protocol.
	Endpoint string
}

// Call is one call that reached the scripted Gitea (faulted ones included).
type Call struct {
	// Seq orders the calls by the start of their handlers.
	Seq int64
	// Method is the RPC's name (FetchTask, UpdateTask, ...).
	Method string
	// Runner is the ID of the registration whose credentials it carried, 0
	// if none.
	Runner int64
	// Conn numbers its connection; ConnAt is when that connection was
	// accepted, and Endpoint the root URL of the endpoint it came to (one
	// Endpoint opened; "" for the URL every process shares), which names the
	// process it was given to, whenever the connection was accepted and
	// whatever became of the process since.
	Conn     int64
	ConnAt   time.Time
	Endpoint string
	// Started is when its handler started, Answered when its answer was
	// written (the handler returned).
	Started, Answered time.Time
	// Task is the task a FetchTask handed out, 0 if none.
	Task int64
}

// TaskRecord is what the scripted Gitea knows of one task.
type TaskRecord struct {
	ID     int64
	Labels []string
	Claims int
	// ClaimedAt is when Gitea claimed it for a runner the first time (zero
	// if never), and Claim the FetchTask call whose answer carried it.
	ClaimedAt time.Time
	Claim     Call
	Result    runnerv1.Result
	Finals    []Final
	Reaped    bool
}

// GiteaOptions configure StartGitea.
type GiteaOptions struct {
	// ZombieTimeout is Gitea's ZOMBIE_TASK_TIMEOUT (scaled down).
	ZombieTimeout time.Duration
	// FaultRate is the share of calls that fail once faults are on.
	FaultRate float64
	// Seed seeds the fault source.
	Seed uint64
}

// StartGitea starts a scripted Gitea on 127.0.0.1 (faults off). Stop ends it.
func StartGitea(ctx context.Context, o GiteaOptions) (*Gitea, error) {
	g := &Gitea{
		RegistrationToken: randomHex(20),
		zombieTimeout:     o.ZombieTimeout,
		faultRate:         o.FaultRate,
		rng:               mathrand.New(mathrand.NewPCG(o.Seed, 0x6174)),
		runners:           map[string]*runner{},
		tasks:             map[int64]*task{},
		version:           1,
	}
	path, h := runnerv1connect.NewRunnerServiceHandler(g)
	mux := http.NewServeMux()
	mux.Handle("/api/actions"+path, http.StripPrefix("/api/actions", g.faults(h)))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("scripted gitea: listen: %w", err)
	}
	g.URL = "http://" + l.Addr().String() + "/"
	g.srv = &http.Server{Handler: g.record(mux), ReadHeaderTimeout: 10 * time.Second, ConnContext: g.connContext}
	go func() { _ = g.srv.Serve(l) }()
	go g.reap(ctx)
	return g, nil
}

// Endpoint opens a new endpoint of the scripted Gitea, a listener of its own
// on 127.0.0.1, and returns its root URL (as URL is). Every call that comes
// to it is recorded with that URL (Call.Endpoint): given to one process
// only, it names that process from the address the kernel delivered the
// connection to, with no lookup that could race the process's end. It
// listens until Stop, so that no later endpoint reuses its port.
func (g *Gitea) Endpoint() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("scripted gitea: listen for an endpoint: %w", err)
	}
	go func() { _ = g.srv.Serve(l) }()
	return "http://" + l.Addr().String() + "/", nil
}

// conn is what the server knows of one connection.
type conn struct {
	id       int64
	at       time.Time
	endpoint string
}

type connKey struct{}

type callKey struct{}

func (g *Gitea) connContext(ctx context.Context, c net.Conn) context.Context {
	info := &conn{id: g.connSeq.Add(1), at: time.Now()}
	if u := "http://" + c.LocalAddr().String() + "/"; u != g.URL {
		info.endpoint = u
	}
	return context.WithValue(ctx, connKey{}, info)
}

// record records every call, with the connection it came on and the
// registration it names.
func (g *Gitea) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := &Call{Seq: g.callSeq.Add(1), Method: r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:], Started: time.Now()}
		if info, ok := r.Context().Value(connKey{}).(*conn); ok {
			c.Conn, c.ConnAt, c.Endpoint = info.id, info.at, info.endpoint
		}
		g.mu.Lock()
		if rn := g.runners[r.Header.Get("x-runner-uuid")]; rn != nil {
			c.Runner = rn.id
		}
		g.mu.Unlock()
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
		g.mu.Lock()
		c.Answered = time.Now()
		g.callLog = append(g.callLog, c)
		g.mu.Unlock()
	})
}

// CallLog returns every call answered so far, in the order their handlers
// started.
func (g *Gitea) CallLog() []Call {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Call, len(g.callLog))
	for i, c := range g.callLog {
		out[i] = *c
	}
	slices.SortFunc(out, func(a, b Call) int { return int(a.Seq - b.Seq) })
	return out
}

// Stop closes the server.
func (g *Gitea) Stop() { _ = g.srv.Close() }

// SetFaults turns the injected faults on or off.
func (g *Gitea) SetFaults(on bool) { g.faultsOn.Store(on) }

// Calls returns how many calls came in, and how many of them were faulted.
func (g *Gitea) Calls() (calls, faulted int64) { return g.calls.Load(), g.faulted.Load() }

func (g *Gitea) faults(next http.Handler) http.Handler {
	statuses := []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusTooManyRequests}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.calls.Add(1)
		if g.faultsOn.Load() {
			g.rngMu.Lock()
			hit, status := g.rng.Float64() < g.faultRate, statuses[g.rng.IntN(len(statuses))]
			g.rngMu.Unlock()
			if hit {
				g.faulted.Add(1)
				if status == http.StatusTooManyRequests {
					w.Header().Set("Retry-After", "1")
				}
				http.Error(w, "injected fault", status)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// Queue adds a job with runs-on labels from repository repo and returns
// its task ID; it raises the tasks version, as a new job does.
func (g *Gitea) Queue(repo, job string, labels []string) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.nextID++
	id := g.nextID
	t := &task{id: id, labels: slices.Clone(labels), queuedAt: time.Now()}
	t.payload = newTaskPayload(id, g.URL, repo, job, labels)
	g.tasks[id] = t
	g.waiting = append(g.waiting, t)
	g.version++
	return id
}

// Records returns what Gitea knows of every task, by ID.
func (g *Gitea) Records() []TaskRecord {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]TaskRecord, 0, len(g.tasks))
	for _, t := range g.tasks {
		r := TaskRecord{ID: t.id, Labels: slices.Clone(t.labels), Claims: t.claims, ClaimedAt: t.claimed,
			Result: t.result, Finals: slices.Clone(t.finals), Reaped: t.reaped}
		if t.claim != nil {
			r.Claim = *t.claim
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b TaskRecord) int { return int(a.ID - b.ID) })
	return out
}

// Done reports how many tasks have a final result.
func (g *Gitea) Done() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, t := range g.tasks {
		if t.result != runnerv1.Result_RESULT_UNSPECIFIED {
			n++
		}
	}
	return n
}

// update applies an UpdateTask to t as Gitea does. g.mu is held.
func (g *Gitea) update(t *task, result runnerv1.Result, by string) runnerv1.Result {
	now := time.Now()
	if t.result != runnerv1.Result_RESULT_UNSPECIFIED {
		if result != runnerv1.Result_RESULT_UNSPECIFIED {
			t.finals = append(t.finals, Final{Result: result, By: by, At: now})
		}
		return t.result
	}
	t.updated = now
	if result != runnerv1.Result_RESULT_UNSPECIFIED {
		t.result = result
		t.finals = append(t.finals, Final{Result: result, Accepted: true, By: by, At: now})
	}
	return t.result
}

// reap is the zombie reaper: every ZombieTimeout/10, a claimed running task
// not updated for ZombieTimeout is failed.
func (g *Gitea) reap(ctx context.Context) {
	tick := time.NewTicker(max(g.zombieTimeout/10, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		g.mu.Lock()
		for _, t := range g.tasks {
			if t.runner != 0 && t.result == runnerv1.Result_RESULT_UNSPECIFIED && time.Since(t.updated) > g.zombieTimeout {
				t.result, t.reaped = runnerv1.Result_RESULT_FAILURE, true
				t.finals = append(t.finals, Final{Result: t.result, Accepted: true, By: "reaper", At: time.Now()})
			}
		}
		g.mu.Unlock()
	}
}

// auth returns the runner a call's credentials name. g.mu is held.
func (g *Gitea) auth(h http.Header) (*runner, error) {
	r := g.runners[h.Get("x-runner-uuid")]
	if r == nil || r.token != h.Get("x-runner-token") {
		return nil, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("unregistered runner"))
	}
	return r, nil
}

// Register implements runnerv1connect.RunnerServiceHandler.
func (g *Gitea) Register(_ context.Context, req *connect.Request[runnerv1.RegisterRequest]) (*connect.Response[runnerv1.RegisterResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if req.Msg.GetToken() != g.RegistrationToken {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("runner registration token not found"))
	}
	r := &runner{id: int64(len(g.runners) + 1), uuid: randomHex(16), token: randomHex(20), name: req.Msg.GetName(),
		labels: slices.Clone(req.Msg.GetLabels())}
	g.runners[r.uuid] = r
	return connect.NewResponse(&runnerv1.RegisterResponse{Runner: &runnerv1.Runner{
		Id: r.id, Uuid: r.uuid, Token: r.token, Name: r.name, Labels: r.labels, Version: req.Msg.GetVersion(),
	}}), nil
}

// Declare implements runnerv1connect.RunnerServiceHandler: it overwrites the
// runner's labels.
func (g *Gitea) Declare(_ context.Context, req *connect.Request[runnerv1.DeclareRequest]) (*connect.Response[runnerv1.DeclareResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, err := g.auth(req.Header())
	if err != nil {
		return nil, err
	}
	r.labels = slices.Clone(req.Msg.GetLabels())
	return connect.NewResponse(&runnerv1.DeclareResponse{Runner: &runnerv1.Runner{
		Id: r.id, Uuid: r.uuid, Name: r.name, Labels: r.labels, Version: req.Msg.GetVersion(),
	}}), nil
}

// FetchTask implements runnerv1connect.RunnerServiceHandler.
func (g *Gitea) FetchTask(ctx context.Context, req *connect.Request[runnerv1.FetchTaskRequest]) (*connect.Response[runnerv1.FetchTaskResponse], error) {
	call, _ := ctx.Value(callKey{}).(*Call)
	g.mu.Lock()
	defer g.mu.Unlock()
	r, err := g.auth(req.Header())
	if err != nil {
		return nil, err
	}
	res := &runnerv1.FetchTaskResponse{TasksVersion: g.version}
	if req.Msg.GetTasksVersion() == g.version {
		return connect.NewResponse(res), nil
	}
	for i, t := range g.waiting {
		if !subset(t.labels, r.labels) {
			continue
		}
		g.waiting = slices.Delete(g.waiting, i, i+1)
		t.runner, t.claims, t.updated = r.id, t.claims+1, time.Now()
		if t.claimed.IsZero() {
			t.claimed, t.claim = t.updated, call
		}
		if call != nil {
			call.Task = t.id
		}
		res.Task = t.payload
		break
	}
	return connect.NewResponse(res), nil
}

// task returns the task of a call about one task, checking that r holds it.
// g.mu is held.
func (g *Gitea) task(r *runner, id int64) (*task, error) {
	t := g.tasks[id]
	if t == nil || t.runner == 0 {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("task %d: resource does not exist", id))
	}
	if t.runner != r.id {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("invalid runner for task"))
	}
	return t, nil
}

// UpdateTask implements runnerv1connect.RunnerServiceHandler.
func (g *Gitea) UpdateTask(ctx context.Context, req *connect.Request[runnerv1.UpdateTaskRequest]) (*connect.Response[runnerv1.UpdateTaskResponse], error) {
	call, _ := ctx.Value(callKey{}).(*Call)
	g.mu.Lock()
	defer g.mu.Unlock()
	r, err := g.auth(req.Header())
	if err != nil {
		return nil, err
	}
	st := req.Msg.GetState()
	t, err := g.task(r, st.GetId())
	if err != nil {
		return nil, err
	}
	n := len(t.finals)
	result := g.update(t, st.GetResult(), "protocol")
	if len(t.finals) > n {
		t.finals[n].Log = t.lastLog
		if call != nil {
			t.finals[n].Endpoint = call.Endpoint
		}
	}
	return connect.NewResponse(&runnerv1.UpdateTaskResponse{State: &runnerv1.TaskState{Id: t.id, Result: result}}), nil
}

// UpdateLog implements runnerv1connect.RunnerServiceHandler with Gitea's ack
// rule.
func (g *Gitea) UpdateLog(_ context.Context, req *connect.Request[runnerv1.UpdateLogRequest]) (*connect.Response[runnerv1.UpdateLogResponse], error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, err := g.auth(req.Header())
	if err != nil {
		return nil, err
	}
	t, err := g.task(r, req.Msg.GetTaskId())
	if err != nil {
		return nil, err
	}
	ack, index, rows := t.logRows, req.Msg.GetIndex(), req.Msg.GetRows()
	if len(rows) == 0 || index > ack || int64(len(rows))+index <= ack {
		return connect.NewResponse(&runnerv1.UpdateLogResponse{AckIndex: ack}), nil
	}
	if t.archived {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("log file has been archived"))
	}
	rows = rows[ack-index:]
	t.logRows += int64(len(rows))
	t.lastLog = rows[len(rows)-1].GetContent()
	if t.result == runnerv1.Result_RESULT_UNSPECIFIED {
		t.updated = time.Now()
	}
	if req.Msg.GetNoMore() {
		t.archived = true
	}
	return connect.NewResponse(&runnerv1.UpdateLogResponse{AckIndex: t.logRows}), nil
}

func subset(want, have []string) bool {
	for _, l := range want {
		if !slices.Contains(have, l) {
			return false
		}
	}
	return true
}

// newTaskPayload builds a task as Gitea sends it: a single-job workflow, the
// context keys the product reads (repository, job) among the usual ones,
// and the token as a secret.
func newTaskPayload(id int64, serverURL, repo, job string, labels []string) *runnerv1.Task {
	token := randomHex(20)
	owner := repo
	if i := slices.Index([]byte(repo), '/'); i >= 0 {
		owner = repo[:i]
	}
	workflow := fmt.Sprintf("name: ci\non: push\njobs:\n  %s:\n    name: %s\n    runs-on: [%s]\n    steps:\n      - run: echo %d\n",
		job, job, joinQuoted(labels), id)
	ctx, err := structpb.NewStruct(map[string]any{
		"server_url": serverURL, "api_url": serverURL + "api/v1", "gitea_default_actions_url": "https://github.com",
		"repository": repo, "repository_owner": owner, "repositoryUrl": serverURL + repo,
		"run_id": strconv.FormatInt(id, 10), "run_number": strconv.FormatInt(id, 10), "run_attempt": "1",
		"job": job, "workflow": "ci.yml", "event_name": "push", "event": map[string]any{},
		"ref": "refs/heads/main", "ref_name": "main", "ref_type": "branch", "sha": randomHex(20),
		"actor": owner, "triggering_actor": owner, "token": token, "gitea_runtime_token": randomHex(64),
	})
	if err != nil {
		panic(err) // a bug of this file: the map holds plain values only
	}
	return &runnerv1.Task{
		Id: id, WorkflowPayload: []byte(workflow), Context: ctx,
		Secrets: map[string]string{"GITEA_TOKEN": token, "GITHUB_TOKEN": token},
		Vars:    map[string]string{},
	}
}

func joinQuoted(ss []string) string {
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += ", "
		}
		out += strconv.Quote(s)
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
