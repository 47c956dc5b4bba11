// Package dispatcher claims Gitea tasks for runner pools and queues one
// assignment per task; it also keeps the claimed tasks that wait for an
// executor alive in Gitea. It is the core of the `dispatch` function.
//
// Per task the order is: claim (FetchTask), store the sealed payload, publish
// the assignment. A crash after the payload is stored and before the publish
// loses nothing: recover re-publishes a payload that has neither a message
// nor an executor. The window that remains is between Gitea's FetchTask answer
// and the payload write (milliseconds): a crash there leaves a task that
// Gitea runs as claimed until its zombie reaper fails it after
// ZOMBIE_TASK_TIMEOUT; the job ends failed and visible, never silently hung.
// A cancelled caller (SIGTERM, a request that timed out) is no crash: it
// stops further claims, but the claim in flight and the work on a claimed
// task run to the end on a context of their own (see ClaimTimeout).
package dispatcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskworkflow"
)

// Registration is what dispatch needs of a pool's Gitea runner registration
// (gitea.Client).
type Registration interface {
	Declare(ctx context.Context, labels []string) error
	FetchTask(ctx context.Context) (*runnerv1.Task, error)
}

// Tasks is what dispatch needs of gitea.TaskState for the same registration.
// An error of Result that wraps taskassignment.ErrTaskGone says the task is over for
// this registration.
type Tasks interface {
	Result(ctx context.Context, taskID int64) (runnerv1.Result, error)
	Finalize(ctx context.Context, taskID int64, result runnerv1.Result, reason string) error
}

// Queue is where assignments go: the JetStream queue
// (assignmentqueue.Queue) on the KEDA path, a CloudEvents sink
// (assignmentevents.Sender) on the Knative path. Send must be safe to repeat
// for one assignment: both de-duplicate by assignment ID.
type Queue interface {
	Send(ctx context.Context, a taskassignment.Assignment) error
}

// Payloads is where claimed tasks are kept (assignmentqueue.Payloads).
type Payloads interface {
	Put(ctx context.Context, assignmentID string, task *runnerv1.Task) error
	IDs(ctx context.Context) ([]string, error)
	Started(ctx context.Context, assignmentID string) (bool, error)
	Delete(ctx context.Context, assignmentID string) error
}

// Pool is a configured pool with its registration.
type Pool struct {
	runnerpool.Pool
	Registration Registration
	Tasks        Tasks
}

// DefaultKeepAlive is the least time between two heartbeats of a waiting
// task when Dispatcher.KeepAlive is zero: a tenth of Gitea's default
// ZOMBIE_TASK_TIMEOUT.
const DefaultKeepAlive = time.Minute

// DefaultPollInterval is how often dispatch serve and local mode run a
// round of an idle pool on their own by default (Cadence.Idle), besides the
// rounds a webhook, a tick or a freed slot asks for. A job waits for the
// next round half of it on average once Gitea makes it fetchable; a busy
// pool is polled every DefaultBusyInterval instead. An idle round costs
// Gitea one FetchTask (Declare is not repeated, see declare), about 6-11 ms
// of its CPU: at this interval 1.1-1.3 % of one core per pool as measured
// with local mode and dispatch (docs/BENCHMARKS.md, "Idle polling cost"),
// under the budget of 2 % per pool.
const DefaultPollInterval = 500 * time.Millisecond

// ClaimTimeout bounds each step of the work on one claim, on a context
// detached from the caller's: the FetchTask call, then storing and publishing
// the task it returned, then (if that failed, or the task cannot run here)
// failing it in Gitea. From the moment Gitea is asked for a task, the
// caller's cancellation (a SIGTERM, a webhook delivery Gitea gave up on) can
// no longer leave a claimed task with neither a payload nor a final result
// until the zombie reaper; it only stops the next claim.
const ClaimTimeout = 30 * time.Second

// DefaultStoreWait is StoreWait's default: longer than a JetStream leader
// election after a SIGKILL (4 to 9 s on nats-server 2.15.2, measured by the
// chaos run and internal/testenv/natscluster), and short enough to leave
// the compensating Finalize most of a ClaimTimeout of its own.
const DefaultStoreWait = 20 * time.Second

// retryEvery is the first pause between two tries of a step on a claimed
// task; it doubles up to retryAtMost.
const (
	retryEvery  = 250 * time.Millisecond
	retryAtMost = 2 * time.Second
)

// retry runs step until it succeeds, it fails with an error permanent says
// cannot change, or ctx ends; it returns step's last error. Every step it
// serves is idempotent (a payload put replaces, a Finalize of a task
// already ended changes nothing).
func retry(ctx context.Context, step func(context.Context) error, permanent func(error) bool) error {
	pause := retryEvery
	for {
		err := step(ctx)
		if err == nil || (permanent != nil && permanent(err)) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause = min(2*pause, retryAtMost)
	}
}

// Dispatcher claims and queues tasks. Its only memory (per-pool locks, the
// time of the last heartbeat per task, the labels last declared per pool)
// saves work; losing it loses nothing. Safe for concurrent use: calls for one
// pool are serialized in-process.
type Dispatcher struct {
	TrustDomain spiffeid.TrustDomain
	Queue       Queue
	Payloads    Payloads
	Log         *slog.Logger
	// KeepAlive is the least time between two heartbeats this process sends
	// for one waiting task. Gitea fails a task after ZOMBIE_TASK_TIMEOUT
	// (default 10m) without one, so anything up to a few minutes is safe.
	// Zero is DefaultKeepAlive.
	KeepAlive time.Duration
	// StoreWait bounds how long the payload write of a claimed task is
	// retried while NATS cannot take it (0: DefaultStoreWait). A stream
	// whose leader died answers no write until a new one is elected.
	StoreWait time.Duration
	// Observer, when set, hears of every round and every task queued.
	Observer Observer

	mu    sync.Mutex
	locks map[string]*sync.Mutex
	beats map[int64]time.Time
	// declared holds, per pool, the labels of this process's last
	// successful Declare, until a call to Gitea fails for that pool.
	declared map[string][]string
}

// Observer hears what rounds do (metrics). Its methods are called from
// concurrent rounds of different pools, must be safe for that and quick, and
// never see a task's repository, token or payload.
type Observer interface {
	// Round is called once at the end of every Dispatch with its result and
	// error.
	Round(res Result, err error)
	// Queued is called for every task queued, with the time from the start
	// of the FetchTask that claimed it to its assignment published.
	Queued(pool string, pickup time.Duration)
}

// Result is what one Dispatch did.
type Result struct {
	Pool string
	// Claimed are the tasks claimed and queued, in claim order.
	Claimed []taskassignment.Assignment
	// InFlight counts the pool's tasks claimed and not finished before the
	// claims; Free is what capacity left.
	InFlight, Free int
	// KeptAlive counts heartbeats sent for waiting tasks; Ended counts
	// waiting tasks found over (cancelled, reaped) or gone (deleted, another
	// runner's) in Gitea and dropped; Unbeaten counts waiting tasks whose
	// keep-alive failed this round (tried again next round).
	KeptAlive, Ended, Unbeaten int
	// Rejected counts claimed tasks that cannot run here and were failed in
	// Gitea with a log line saying why.
	Rejected int
	// Paused: the pool is paused (runnerpool.Pool.Paused); the round
	// claimed nothing and kept its waiting tasks alive.
	Paused bool
}

func (d *Dispatcher) log() *slog.Logger {
	if d.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Log
}

func (d *Dispatcher) lock(pool string) func() {
	d.mu.Lock()
	if d.locks == nil {
		d.locks = map[string]*sync.Mutex{}
		d.beats = map[int64]time.Time{}
	}
	l, ok := d.locks[pool]
	if !ok {
		l = &sync.Mutex{}
		d.locks[pool] = l
	}
	d.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Dispatch runs one round for pool p: declare its labels unless they are
// declared already (see declare), claim tasks until Gitea has none for the
// pool or the pool is full, then keep its waiting tasks alive (dropping
// those Gitea has ended or no longer has), and if that freed slots of a
// pool the claims had filled, claim into them. Free capacity is the pool's
// Capacity minus its tasks in flight: every task claimed whose payload is
// still stored (queued, being started or running; recover deletes payloads
// of finished tasks). The claims come first so that a job Gitea has ready
// never waits for one heartbeat per waiting task; a slot held by a task
// Gitea no longer has is still freed and filled within the round.
//
// Keep-alive is per task: one task's failed heartbeat is logged and counted
// (Unbeaten), and the round goes on, so a single broken task never stops its
// pool from claiming. The waiting tasks are kept alive also when the claims
// failed. Any other error ends the claims: tasks claimed before it are
// queued and in the Result. Nothing is claimed when Gitea or the payload
// store is unreachable. Once ctx ends no further task is claimed, and the
// claim in flight still runs to its end (ClaimTimeout).
//
// A paused pool (runnerpool.Pool.Paused) claims nothing, not even a
// Declare: Gitea keeps its queued jobs; its waiting tasks are kept alive,
// and its running ones end as they would.
func (d *Dispatcher) Dispatch(ctx context.Context, p Pool) (res Result, err error) {
	defer d.lock(p.Name)()
	if d.Observer != nil {
		defer func() { d.Observer.Round(res, err) }()
	}
	res = Result{Pool: p.Name, Paused: p.Paused}
	ids, err := d.Payloads.IDs(ctx)
	if err != nil {
		return res, fmt.Errorf("pool %s: tasks in flight: %w", p.Name, err)
	}
	inFlight := poolIDs(ids, p.Name)
	var (
		full     bool
		claimErr error
	)
	if !p.Paused {
		full, claimErr = d.claim(ctx, p, &res, p.Capacity-len(inFlight))
	}
	for _, id := range inFlight {
		kept, ended, err := d.keepAlive(ctx, p, id)
		if err != nil {
			// Another task's heartbeat, and the claims, may well succeed.
			d.log().Warn("keep-alive failed; trying again next round", slog.String("pool", p.Name),
				slog.String("assignment", id), slog.Any("error", err))
			res.Unbeaten++
		}
		if kept {
			res.KeptAlive++
		}
		if ended {
			res.Ended++
		}
	}
	res.InFlight = len(inFlight) - res.Ended
	res.Free = max(p.Capacity-res.InFlight, 0)
	if claimErr != nil {
		return res, claimErr
	}
	if full && res.Ended > 0 {
		_, err = d.claim(ctx, p, &res, res.Free-len(res.Claimed))
	}
	return res, err
}

// claim claims up to n tasks of p into res, and reports whether it stopped
// for n (full) rather than because Gitea had no more.
func (d *Dispatcher) claim(ctx context.Context, p Pool, res *Result, n int) (full bool, err error) {
	if n <= 0 {
		return true, nil
	}
	if err := d.declare(ctx, p); err != nil {
		return false, fmt.Errorf("pool %s: declare: %w", p.Name, err)
	}
	for claimed := 0; claimed < n; {
		if err := ctx.Err(); err != nil {
			return false, fmt.Errorf("pool %s: claims stopped: %w", p.Name, err)
		}
		start := time.Now()
		task, err := d.fetch(ctx, p)
		if err != nil {
			d.undeclare(p.Name)
			return false, fmt.Errorf("pool %s: fetch task: %w", p.Name, err)
		}
		if task == nil {
			return false, nil
		}
		d.log().Debug("task claimed", slog.String("pool", p.Name), slog.Int64("task", task.GetId()))
		a, err := d.queue(ctx, p, task)
		if errors.Is(err, errRejected) {
			res.Rejected++
			continue
		}
		if err != nil {
			return false, err
		}
		res.Claimed = append(res.Claimed, a)
		claimed++
		if d.Observer != nil {
			d.Observer.Queued(p.Name, time.Since(start))
		}
	}
	return true, nil
}

var errRejected = errors.New("task rejected")

// declare sends p's labels to Gitea (Declare), unless this process's last
// successful Declare for p sent the same ones. Only Register and Declare
// change a registration's labels in Gitea, so once declared they stand: a
// round need not repeat the call (a write in Gitea's database, as costly as
// the FetchTask it precedes). A failed FetchTask forgets them (the
// registration may be gone, or re-created), so the next round declares
// again; so does a process that starts.
func (d *Dispatcher) declare(ctx context.Context, p Pool) error {
	d.mu.Lock()
	last, ok := d.declared[p.Name]
	d.mu.Unlock()
	if ok && slices.Equal(last, p.Labels) {
		return nil
	}
	if err := p.Registration.Declare(ctx, p.Labels); err != nil {
		d.undeclare(p.Name)
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.declared == nil {
		d.declared = map[string][]string{}
	}
	d.declared[p.Name] = slices.Clone(p.Labels)
	return nil
}

// undeclare forgets pool's declared labels: its next round declares them.
func (d *Dispatcher) undeclare(pool string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.declared, pool)
}

// detached returns a context that keeps ctx's values but not its
// cancellation, ending after ClaimTimeout: work on a claimed task must not
// stop half-way because its caller went away.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), ClaimTimeout)
}

// fetch claims one task for p, or returns nil when Gitea has none. The call
// is not cancelled with ctx: Gitea may have claimed the task by the time a
// cancel would abort the call, and the answer would be lost with the task.
func (d *Dispatcher) fetch(ctx context.Context, p Pool) (*runnerv1.Task, error) {
	ctx, cancel := detached(ctx)
	defer cancel()
	return p.Registration.FetchTask(ctx)
}

// queue stores and publishes one claimed task, or fails it in Gitea with the
// reason it cannot run. Every step runs on a detached context: a cancelled
// ctx never leaves the task claimed with neither a payload nor a result.
func (d *Dispatcher) queue(ctx context.Context, p Pool, task *runnerv1.Task) (taskassignment.Assignment, error) {
	log := d.log().With(slog.String("pool", p.Name), slog.Int64("task", task.GetId()))
	a, err := d.assignment(p, task)
	if err != nil {
		// The task is ours now; leaving it would keep the job running until
		// the zombie reaper. End it with the reason instead.
		log.Error("claimed task cannot run here", slog.Any("error", err))
		reason := fmt.Sprintf("gitea-dynamic-runner cannot run this task: %v", err)
		if ferr := d.finalize(ctx, p, task.GetId(), reason); ferr != nil {
			return a, fmt.Errorf("pool %s: task %d: %w (and failing it in Gitea: %w)", p.Name, task.GetId(), err, ferr)
		}
		return a, errRejected
	}
	log = log.With(slog.String("assignment", a.ID))
	// Retried: a write NATS refuses for a moment (a stream leader being
	// elected) would otherwise fail a task that can run.
	putCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(d.StoreWait, DefaultStoreWait))
	err = retry(putCtx, func(ctx context.Context) error { return d.Payloads.Put(ctx, a.ID, task) }, nil)
	cancel()
	if err != nil {
		reason := "gitea-dynamic-runner could not store the task for an executor; run the job again"
		if ferr := d.finalize(ctx, p, task.GetId(), reason); ferr != nil {
			log.Error("claimed task neither stored nor failed; Gitea's zombie reaper will end it", slog.Any("error", ferr))
		}
		return a, fmt.Errorf("pool %s: store task %d: %w", p.Name, task.GetId(), err)
	}
	pubCtx, cancel := detached(ctx)
	err = d.Queue.Send(pubCtx, a)
	cancel()
	if err != nil {
		// The payload is stored: recover re-publishes it.
		return a, fmt.Errorf("pool %s: publish assignment %s (recover will re-publish it): %w", p.Name, a.ID, err)
	}
	d.beat(task.GetId())
	log.Info("task claimed and queued", slog.String("repository", a.Identity.Repository),
		slog.String("job", a.Identity.Task), slog.String("backend", string(a.Backend)))
	return a, nil
}

// finalize fails a claimed task in Gitea with reason, on a detached context,
// retrying a Gitea that does not answer (until ClaimTimeout): it is the
// task's last chance before Gitea's zombie reaper. A task Gitea no longer
// has is not retried.
func (d *Dispatcher) finalize(ctx context.Context, p Pool, taskID int64, reason string) error {
	ctx, cancel := detached(ctx)
	defer cancel()
	return retry(ctx, func(ctx context.Context) error {
		return p.Tasks.Finalize(ctx, taskID, runnerv1.Result_RESULT_FAILURE, reason)
	}, func(err error) bool { return errors.Is(err, taskassignment.ErrTaskGone) })
}

func (d *Dispatcher) assignment(p Pool, task *runnerv1.Task) (taskassignment.Assignment, error) {
	return taskworkflow.FromTask(d.TrustDomain, p.Backend, p.Name, task)
}

// keepAlive heartbeats one waiting task of the pool, at most every
// KeepAlive. A task whose executor has started is left to it. A task Gitea
// has ended (cancelled while waiting, reaped) is dropped: its payload is
// deleted, and recover deletes any executor it has. (Registrations do not
// declare "cancelling", so a cancelled task is done at once and needs no
// final report from us.) So is a task Gitea no longer has for this
// registration (taskassignment.ErrTaskGone: deleted with its repository, another
// runner's): its payload would otherwise count against the pool's capacity
// until it expired, hours later. Any other error leaves the task as it is,
// due again next round.
func (d *Dispatcher) keepAlive(ctx context.Context, p Pool, assignmentID string) (kept, ended bool, err error) {
	_, taskID, err := taskassignment.ParseID(assignmentID)
	if err != nil {
		d.log().Warn("payload under a foreign key ignored", slog.String("key", assignmentID))
		return false, false, nil
	}
	if !d.due(taskID) {
		return false, false, nil
	}
	started, err := d.Payloads.Started(ctx, assignmentID)
	if err != nil {
		return false, false, fmt.Errorf("pool %s: keep-alive of %s: %w", p.Name, assignmentID, err)
	}
	if started {
		return false, false, nil
	}
	result, err := p.Tasks.Result(ctx, taskID)
	if errors.Is(err, taskassignment.ErrTaskGone) {
		err = d.drop(ctx, p, assignmentID, taskID, "waiting task gone from Gitea; dropped", slog.Any("answer", err))
		return false, err == nil, err
	}
	if err != nil {
		return false, false, fmt.Errorf("pool %s: keep-alive of %s: %w", p.Name, assignmentID, err)
	}
	d.beat(taskID)
	if result == runnerv1.Result_RESULT_UNSPECIFIED {
		return true, false, nil
	}
	err = d.drop(ctx, p, assignmentID, taskID, "waiting task ended in Gitea; dropped", slog.String("result", result.String()))
	return true, err == nil, err
}

// drop deletes the payload of a waiting task that is over for us, and logs
// why. On an error the task is not ended: it stays in flight, due again.
func (d *Dispatcher) drop(ctx context.Context, p Pool, assignmentID string, taskID int64, msg string, why slog.Attr) error {
	if err := d.Payloads.Delete(ctx, assignmentID); err != nil {
		return fmt.Errorf("pool %s: drop %s: %w", p.Name, assignmentID, err)
	}
	d.forget(taskID)
	d.log().Info(msg, slog.String("pool", p.Name), slog.String("assignment", assignmentID), why)
	return nil
}

func (d *Dispatcher) due(taskID int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	last, ok := d.beats[taskID]
	keepAlive := d.KeepAlive
	if keepAlive == 0 {
		keepAlive = DefaultKeepAlive
	}
	return !ok || time.Since(last) >= keepAlive
}

func (d *Dispatcher) beat(taskID int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.beats == nil {
		d.beats = map[int64]time.Time{}
	}
	d.beats[taskID] = time.Now()
}

func (d *Dispatcher) forget(taskID int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.beats, taskID)
}

// poolIDs returns the assignment IDs of pool among ids.
func poolIDs(ids []string, pool string) []string {
	var out []string
	for _, id := range ids {
		if p, _, err := taskassignment.ParseID(id); err == nil && p == pool {
			out = append(out, id)
		}
	}
	return out
}
