package chaos

import (
	"context"
	"errors"
	mathrand "math/rand/v2"
	"sync"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Gateway is what a simulated executor needs of the gateway's payload side
// (assignmentqueue.Payloads): its task, and the mark that it took it.
type Gateway interface {
	Get(ctx context.Context, assignmentID string) (*runnerv1.Task, error)
	MarkStarted(ctx context.Context, assignmentID string) error
}

// Executors simulates what runs inside each sandbox the fake holds, as the
// runner does it: it boots, fetches its task through the gateway (which
// marks it started), heartbeats, runs for a random while, and then either
// reports its final result to Gitea and ends (Terminated), or (a share
// Unreported) ends Failed without reporting, which recover must report. An
// executor whose sandbox is deleted stops where it is, as a killed sandbox
// would.
type Executors struct {
	Sandboxes *sandboxapitest.Server
	Gitea     *Gitea
	Gateway   func() Gateway
	Keys      taskassignment.Keys
	// Unreported is the share of executors that end without reporting.
	Unreported float64
	// MinRun, MaxRun bound how long a job runs.
	MinRun, MaxRun time.Duration

	rngMu sync.Mutex
	rng   *mathrand.Rand

	mu         sync.Mutex
	started    int
	unreported int
	reported   int
}

// Run starts an executor for every sandbox created, until ctx ends.
func (x *Executors) Run(ctx context.Context, seed uint64) {
	x.rng = mathrand.New(mathrand.NewPCG(seed, 0x657865))
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
			go x.run(ctx, sb)
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

// run is one sandbox's executor.
func (x *Executors) run(ctx context.Context, sb sandboxapitest.Sandbox) {
	id := sb.ID
	aid := sb.Metadata[x.Keys.AssignmentID]
	_, taskID, err := taskassignment.ParseID(aid)
	if err != nil {
		x.Sandboxes.Transition(id, "Failed")
		return
	}
	if !x.sleep(ctx, time.Duration(50+x.rand()*250)*time.Millisecond) || !x.Sandboxes.Transition(id, "Running") {
		return
	}
	x.mu.Lock()
	x.started++
	x.mu.Unlock()
	// The runner fetches its task through the gateway, which reads the
	// payload and marks it started; the runner retries while the gateway
	// cannot (NATS restarting), and gives up on a payload that is gone.
	if !x.fetch(ctx, aid) {
		x.Sandboxes.Transition(id, "Failed")
		return
	}
	run := x.MinRun + time.Duration(x.rand()*float64(x.MaxRun-x.MinRun))
	deadline := time.Now().Add(run)
	for time.Now().Before(deadline) {
		if _, ok := x.Sandboxes.Sandbox(id); !ok {
			return // deleted under the executor
		}
		if x.Gitea.RunnerUpdate(taskID, runnerv1.Result_RESULT_UNSPECIFIED) != runnerv1.Result_RESULT_UNSPECIFIED {
			x.Sandboxes.Transition(id, "Terminated") // cancelled or reaped: the runner stops
			return
		}
		if !x.sleep(ctx, min(time.Second, time.Until(deadline))) {
			return
		}
	}
	if x.rand() < x.Unreported {
		x.mu.Lock()
		x.unreported++
		x.mu.Unlock()
		x.Sandboxes.Transition(id, "Failed")
		return
	}
	if _, ok := x.Sandboxes.Sandbox(id); !ok {
		return
	}
	result := runnerv1.Result_RESULT_SUCCESS
	if x.rand() < 0.2 {
		result = runnerv1.Result_RESULT_FAILURE
	}
	x.Gitea.RunnerUpdate(taskID, result)
	x.mu.Lock()
	x.reported++
	x.mu.Unlock()
	x.Sandboxes.Transition(id, "Terminated")
}

// fetch gets the task through the gateway and marks it started, retrying
// for up to 10 s; false if the payload is gone or the gateway never answers.
func (x *Executors) fetch(ctx context.Context, aid string) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		gw := x.Gateway()
		if gw != nil {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := gw.Get(cctx, aid)
			if err == nil {
				err = gw.MarkStarted(cctx, aid)
			}
			cancel()
			if err == nil {
				return true
			}
			if isNotFound(err) {
				return false
			}
		}
		if !x.sleep(ctx, 200*time.Millisecond) {
			return false
		}
	}
	return false
}

// Counts returns how many executors started, reported, and ended without
// reporting.
func (x *Executors) Counts() (started, reported, unreported int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.started, x.reported, x.unreported
}

func isNotFound(err error) bool { return errors.Is(err, taskassignment.ErrPayloadNotFound) }
