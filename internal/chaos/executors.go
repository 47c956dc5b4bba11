package chaos

import (
	"context"
	"fmt"
	mathrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gateway"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Executors simulates what runs inside each sandbox the fake holds, as the
// runner does it, through the real gateway: from the variables its sandbox
// was created with (its SVID, its capability, the gateway's URL and SPIFFE
// ID) it opens the runner's own mTLS client to the gateway, fetches its task
// (which the gateway marks started), heartbeats, runs for a random while,
// and then either reports its final result and ends (Terminated), or (a
// share Unreported) ends Failed without reporting, which recover must
// report. Like the runner it retries a gateway it cannot reach (killed,
// restarting, NATS electing a leader). An executor whose sandbox is deleted
// stops where it is, as a killed sandbox would. Each one records what it did
// (Records).
type Executors struct {
	Sandboxes *sandboxapitest.Server
	// TrustDomain is the trust domain of the SVIDs and the bundle the
	// sandboxes are given.
	TrustDomain spiffeid.TrustDomain
	Keys        taskassignment.Keys
	// Unreported is the share of executors that end without reporting.
	Unreported float64
	// MinRun, MaxRun bound how long a job runs.
	MinRun, MaxRun time.Duration

	rngMu sync.Mutex
	rng   *mathrand.Rand

	mu      sync.Mutex
	records []*ExecRecord
}

// ExecEnd says how a simulated executor ended.
type ExecEnd string

const (
	// ExecRunning: it has not ended.
	ExecRunning ExecEnd = ""
	// ExecNoTask: it ended without its task, so it reported nothing: the
	// gateway refused its fetch (an error the runner does not retry, or
	// another task or none handed out), or never answered it for
	// gatewayRetry, or its sandbox's variables were unusable (RefusedAt and
	// Refusal say when and why).
	ExecNoTask ExecEnd = "no-task"
	// ExecReported: it sent its final result (Result) and ended.
	ExecReported ExecEnd = "reported"
	// ExecUnreported: it ended without reporting (a crashed runner).
	ExecUnreported ExecEnd = "unreported"
	// ExecStopped: its sandbox was deleted (or expired) while it ran; EndedAt
	// is when the backend removed it.
	ExecStopped ExecEnd = "stopped"
	// ExecCancelled: Gitea answered its heartbeat with a final result it had
	// not sent, and it stopped, as the runner stops a cancelled job.
	ExecCancelled ExecEnd = "cancelled"
	// ExecAbandoned: the run ended while it ran (the harness stopped it).
	ExecAbandoned ExecEnd = "abandoned"
)

// ExecRecord is what one simulated executor (one sandbox) did, told from its
// own side: what it sent and what it was answered, not how either
// travelled.
type ExecRecord struct {
	Sandbox, Assignment string
	Task                int64
	// Created is when its sandbox was created, Started when it had fetched
	// its task (zero if it never did).
	Created, Started time.Time
	End              ExecEnd
	// EndedAt is when it ended: for ExecReported when Gitea's answer to its
	// report came back, for ExecStopped when its sandbox was removed.
	EndedAt time.Time
	// Result is the final result it reported, SentAt when it sent it, and
	// Answer the result Gitea answered (its own when accepted); ReportErr
	// says why the report got no answer, "" if it did.
	Result, Answer runnerv1.Result
	SentAt         time.Time
	ReportErr      string
	// RefusedAt is, for ExecNoTask, when the refusal began: the send time
	// of the fetch the gateway refused, or of its first fetch when the
	// gateway never answered one; zero if it never fetched (its sandbox's
	// variables were unusable, EndedAt then). Refusal says what it was told.
	RefusedAt time.Time
	Refusal   string
}

// Run starts an executor for every sandbox created, until ctx ends; it
// returns once every executor it started has ended.
func (x *Executors) Run(ctx context.Context, seed uint64) {
	x.rng = mathrand.New(mathrand.NewPCG(seed, 0x657865))
	var wg sync.WaitGroup
	defer wg.Wait()
	seen := 0
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		created := x.Sandboxes.Created()
		for _, sb := range created[seen:] {
			wg.Go(func() { x.run(ctx, sb) })
		}
		seen = len(created)
	}
}

func (x *Executors) rand() float64 {
	x.rngMu.Lock()
	defer x.rngMu.Unlock()
	return x.rng.Float64()
}

func (x *Executors) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// gatewayRetry bounds how long an executor retries a call the gateway does
// not answer (as the runner's reporter does); far longer than a gateway's
// restart or a NATS leader election.
const gatewayRetry = time.Minute

// update is the executor's UpdateTask through the gateway: a heartbeat with
// result unspecified, else its final result; it returns Gitea's view of the
// task. A final result is retried while the gateway cannot answer, as the
// runner retries it; a heartbeat is tried once.
func (x *Executors) update(ctx context.Context, c runnerv1connect.RunnerServiceClient, taskID int64, result runnerv1.Result) (runnerv1.Result, error) {
	state := &runnerv1.TaskState{Id: taskID, Result: result}
	if result != runnerv1.Result_RESULT_UNSPECIFIED {
		state.StoppedAt = timestamppb.Now()
	}
	deadline := time.Now().Add(gatewayRetry)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := c.UpdateTask(cctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: state}))
		cancel()
		if err == nil {
			return res.Msg.GetState().GetResult(), nil
		}
		if result == runnerv1.Result_RESULT_UNSPECIFIED || !retryable(err) || time.Now().After(deadline) || !x.sleep(ctx, 200*time.Millisecond) {
			return runnerv1.Result_RESULT_UNSPECIFIED, err
		}
	}
}

// retryable is what the runner retries: the gateway unreachable, or it
// could not reach NATS or Gitea.
func retryable(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeUnknown, connect.CodeInternal, connect.CodeResourceExhausted:
		return true
	}
	return false
}

// client is the runner-protocol client of sb's executor: the runner's own
// (gateway.NewClient), from the variables sb was created with.
func (x *Executors) client(sb sandboxapitest.Sandbox) (runnerv1connect.RunnerServiceClient, error) {
	env := sb.Env
	svid, err := x509svid.Parse([]byte(env[bootstrap.EnvSVIDCert]), []byte(env[bootstrap.EnvSVIDKey]))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: its SVID: %w", sb.ID, err)
	}
	bundle, err := x509bundle.Parse(x.TrustDomain, []byte(env[bootstrap.EnvSVIDBundle]))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: its bundle: %w", sb.ID, err)
	}
	gatewayID, err := spiffeid.FromString(env[bootstrap.EnvGatewayID])
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: the gateway's ID: %w", sb.ID, err)
	}
	creds := gateway.Credentials{SVID: x509svid.Source(staticSVID{svid}), Bundle: bundle,
		AssignmentID: env[bootstrap.EnvAssignmentID], Capability: env[bootstrap.EnvCapability]}
	return gateway.NewClient(env[bootstrap.EnvGatewayURL], creds, tlsconfig.AuthorizeID(gatewayID)), nil
}

// staticSVID serves one SVID, as a sandbox holds the one it was created with.
type staticSVID struct{ svid *x509svid.SVID }

func (s staticSVID) GetX509SVID() (*x509svid.SVID, error) { return s.svid, nil }

// end records how rec ended, at at (now if zero).
func (x *Executors) end(rec *ExecRecord, how ExecEnd, at time.Time) {
	if at.IsZero() {
		at = time.Now()
	}
	x.mu.Lock()
	rec.End, rec.EndedAt = how, at
	x.mu.Unlock()
}

// stopped records that rec's sandbox was removed under it.
func (x *Executors) stopped(rec *ExecRecord) {
	at, _ := x.Sandboxes.DeletedAt(rec.Sandbox)
	x.end(rec, ExecStopped, at)
}

// run is one sandbox's executor.
func (x *Executors) run(ctx context.Context, sb sandboxapitest.Sandbox) {
	id := sb.ID
	aid := sb.Metadata[x.Keys.AssignmentID]
	rec := &ExecRecord{Sandbox: id, Assignment: aid, Created: sb.CreatedAt}
	x.mu.Lock()
	x.records = append(x.records, rec)
	x.mu.Unlock()
	_, taskID, err := taskassignment.ParseID(aid)
	if err != nil {
		x.end(rec, ExecNoTask, time.Time{})
		x.Sandboxes.Transition(id, "Failed")
		return
	}
	x.mu.Lock()
	rec.Task = taskID
	x.mu.Unlock()
	client, err := x.client(sb)
	if err != nil {
		x.mu.Lock()
		rec.Refusal = err.Error()
		x.mu.Unlock()
		x.end(rec, ExecNoTask, time.Time{})
		x.Sandboxes.Transition(id, "Failed")
		return
	}
	if !x.sleep(ctx, time.Duration(50+x.rand()*250)*time.Millisecond) {
		x.end(rec, ExecAbandoned, time.Time{})
		return
	}
	if !x.Sandboxes.Transition(id, "Running") {
		x.stopped(rec)
		return
	}
	// The runner fetches its task through the gateway, which reads the
	// payload and marks it started; the runner retries while the gateway
	// cannot (killed, NATS electing), and gives up on a payload that is gone.
	if ok, refusedAt, refusal := x.fetch(ctx, client, taskID); !ok {
		switch _, ok := x.Sandboxes.Sandbox(id); {
		case ctx.Err() != nil:
			x.end(rec, ExecAbandoned, time.Time{})
		case !ok:
			x.stopped(rec)
		default:
			x.mu.Lock()
			rec.RefusedAt, rec.Refusal = refusedAt, refusal
			x.mu.Unlock()
			x.end(rec, ExecNoTask, time.Time{})
			x.Sandboxes.Transition(id, "Failed")
		}
		return
	}
	x.mu.Lock()
	rec.Started = time.Now()
	x.mu.Unlock()
	run := x.MinRun + time.Duration(x.rand()*float64(x.MaxRun-x.MinRun))
	deadline := time.Now().Add(run)
	for time.Now().Before(deadline) {
		if _, ok := x.Sandboxes.Sandbox(id); !ok {
			x.stopped(rec) // deleted under the executor
			return
		}
		if r, err := x.update(ctx, client, taskID, runnerv1.Result_RESULT_UNSPECIFIED); err == nil && r != runnerv1.Result_RESULT_UNSPECIFIED {
			x.end(rec, ExecCancelled, time.Time{}) // cancelled or reaped: the runner stops
			x.Sandboxes.Transition(id, "Terminated")
			return
		}
		if !x.sleep(ctx, min(time.Second, time.Until(deadline))) {
			x.end(rec, ExecAbandoned, time.Time{})
			return
		}
	}
	if x.rand() < x.Unreported {
		x.end(rec, ExecUnreported, time.Time{})
		x.Sandboxes.Transition(id, "Failed")
		return
	}
	if _, ok := x.Sandboxes.Sandbox(id); !ok {
		x.stopped(rec)
		return
	}
	result := runnerv1.Result_RESULT_SUCCESS
	if x.rand() < 0.2 {
		result = runnerv1.Result_RESULT_FAILURE
	}
	x.mu.Lock()
	rec.Result, rec.SentAt = result, time.Now()
	x.mu.Unlock()
	answer, err := x.update(ctx, client, taskID, result)
	x.mu.Lock()
	rec.Answer = answer
	if err != nil {
		rec.ReportErr = err.Error()
	}
	x.mu.Unlock()
	x.end(rec, ExecReported, time.Time{})
	x.Sandboxes.Transition(id, "Terminated")
}

// fetch gets the task through the gateway (which marks it started),
// retrying for up to gatewayRetry as the runner does. It returns false if
// the gateway refuses (an error the runner does not retry: the payload
// gone, the task over, ...), hands out another task or none, or never
// answers; then refusedAt is when the refusal began (the send time of the
// refused fetch, or of the first one when no fetch was answered) and
// refusal what the gateway said.
func (x *Executors) fetch(ctx context.Context, c runnerv1connect.RunnerServiceClient, taskID int64) (ok bool, refusedAt time.Time, refusal string) {
	first := time.Now()
	deadline := first.Add(gatewayRetry)
	for {
		sent := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := c.FetchTask(cctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
		cancel()
		if err == nil {
			if got := res.Msg.GetTask().GetId(); got != taskID {
				return false, sent, fmt.Sprintf("the gateway handed out task %d, not %d", got, taskID)
			}
			return true, time.Time{}, ""
		}
		if !retryable(err) {
			return false, sent, err.Error()
		}
		if time.Now().After(deadline) || !x.sleep(ctx, 200*time.Millisecond) {
			return false, first, fmt.Sprintf("no answer for %s: %v", time.Since(first).Round(time.Second), err)
		}
	}
}

// Records returns what every executor did so far, by the creation of its
// sandbox.
func (x *Executors) Records() []ExecRecord {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]ExecRecord, len(x.records))
	for i, r := range x.records {
		out[i] = *r
	}
	slices.SortStableFunc(out, func(a, b ExecRecord) int { return a.Created.Compare(b.Created) })
	return out
}

// Counts returns how many executors started (fetched their task), reported,
// ended without reporting, and ended without their task.
func (x *Executors) Counts() (started, reported, unreported, noTask int) {
	for _, r := range x.Records() {
		if !r.Started.IsZero() {
			started++
		}
		switch r.End {
		case ExecReported:
			reported++
		case ExecUnreported:
			unreported++
		case ExecNoTask:
			noTask++
		}
	}
	return started, reported, unreported, noTask
}
