// Package reporter turns the log-hook entries of Gitea's act fork into the
// state and the log of one Gitea task, and delivers them with Gitea's runner
// protocol (UpdateLog, UpdateTask), as RUNNER-PROTOCOL.md §2.5 and §2.6
// describe.
//
// Lifecycle: New, then Start (the flush loop), then act runs with the
// Reporter as its logger hook (common.WithLoggerHook) under JobContext, then
// SetOutputs and finally Close, exactly once, which ends the task in Gitea.
//
// Invariants a caller relies on:
//   - No row, log message or returned error's text holds a known secret in
//     clear: the task token, the runtime token, the OIDC request token, every
//     secret (and each line of a multi-line one) and every add-mask value are
//     replaced by "***" before anything leaves the Reporter.
//   - The log Gitea stores is exactly [set-up][step 0]…[step n][complete]:
//     each step's rows are contiguous at its LogIndex/LogLength.
//   - Rows are sent from Gitea's acknowledged offset: no gap, no duplicate.
//   - Every UpdateTask carries every step; only Close sends a result, once,
//     after the log is archived (no_more) and the outputs are stored.
package reporter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Client is the part of Gitea's runner protocol the Reporter calls. Errors
// keep their Connect code (connect.CodeOf): only unavailable and
// deadline_exceeded are taken for transport failures.
type Client interface {
	UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error)
	UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error)
}

// Options tune the Reporter. The zero value means the defaults.
type Options struct {
	// LogInterval is the period of log flushes (default 5s).
	LogInterval time.Duration
	// StateInterval is the period of the state heartbeat, sent even when
	// nothing changed (default 5s). It must stay well under Gitea's
	// one-minute cancel handshake and ten-minute zombie timeout.
	StateInterval time.Duration
	// MaxBufferedRows flushes the log once this many rows arrived since the
	// last flush (default 100).
	MaxBufferedRows int
	// FirstRowDelay flushes the log this long after the first row that
	// arrived since the last flush (default 3s).
	FirstRowDelay time.Duration
	// CallTimeout bounds each protocol call (default 10s).
	CallTimeout time.Duration
	// RetryDelay is the pause between Close's retries (default 1s).
	RetryDelay time.Duration
	// CloseTimeout bounds each of Close's deliveries, the log's, the
	// outputs' and the result's (default 1m): a log that cannot be
	// delivered leaves the result its own chance.
	CloseTimeout time.Duration
	// Now is the clock for the Reporter's own rows and times (default
	// time.Now). Act's rows keep their entry's time.
	Now func() time.Time
	// Logger receives the Reporter's own failures (masked), such as a flush
	// that will be retried (default logrus.StandardLogger()). It must not
	// have the Reporter as a hook.
	Logger logrus.FieldLogger
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.LogInterval, 5*time.Second)
	def(&o.StateInterval, 5*time.Second)
	def(&o.FirstRowDelay, 3*time.Second)
	def(&o.CallTimeout, 10*time.Second)
	def(&o.RetryDelay, time.Second)
	def(&o.CloseTimeout, time.Minute)
	if o.MaxBufferedRows <= 0 {
		o.MaxBufferedRows = 100
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	return o
}

// Output limits Gitea enforces (it drops larger ones silently).
const (
	maxOutputKey   = 255
	maxOutputValue = 1 << 20
)

// StoppedWords is the last row of a job cancelled because the runner itself
// was stopped (its lifetime ended: SIGTERM when its Pod or sandbox is
// deleted, evicted or reaches its timeout), not by a cancel in Gitea, so the
// job's users see why it ended.
const StoppedWords = "gitea-dynamic-runner: the runner was stopped before the job ended: its executor is being removed (deleted, evicted, or at its timeout)"

// Reporter reports one Gitea task. Its methods are safe for concurrent use.
type Reporter struct {
	client Client
	opt    Options
	taskID int64
	debug  bool // secrets.ACTIONS_STEP_DEBUG == "true"

	ctx       context.Context // the lifetime
	jobCtx    context.Context
	jobCancel context.CancelFunc
	loopCtx   context.Context
	loopStop  context.CancelFunc
	loopDone  chan struct{}
	wake      chan struct{} // buffered(1): the loop has something to look at
	sem       chan struct{} // buffered(1): one protocol call at a time

	closeOnce sync.Once
	closeErr  error

	mu           sync.Mutex
	state        *runnerv1.TaskState
	rows         []*runnerv1.LogRow // not yet acknowledged; rows[0] is row logOffset
	logOffset    int64              // rows Gitea acknowledged
	tail         int                // the step whose rows end the log, or -1
	fresh        int                // rows appended since the last UpdateLog was prepared
	urgent       bool               // a step started or stopped, or the job ended
	deferred     []*runnerv1.LogRow // own rows held back while steps run
	masks        masker
	stopToken    string // set by stop-commands
	outputs      map[string]string
	sentOutputs  map[string]bool
	serverResult runnerv1.Result // a result Gitea answered to a non-final call
	started      bool
	closed       bool
	result       runnerv1.Result // what Close sent
}

// New returns the Reporter of task, a job of steps steps (one StepState per
// index of job.Steps, the same index act logs as stepNumber). Its masks
// start with the task's token, runtime token, OIDC request token and every
// secret. ctx is its lifetime: when ctx ends, the flush loop stops and
// JobContext is cancelled; Close still delivers, on a detached context.
func New(ctx context.Context, c Client, task *runnerv1.Task, steps int, opt Options) *Reporter {
	r := &Reporter{
		client:      c,
		opt:         opt.withDefaults(),
		taskID:      task.GetId(),
		debug:       task.GetSecrets()["ACTIONS_STEP_DEBUG"] == "true",
		ctx:         ctx,
		tail:        -1,
		loopDone:    make(chan struct{}),
		wake:        make(chan struct{}, 1),
		sem:         make(chan struct{}, 1),
		outputs:     map[string]string{},
		sentOutputs: map[string]bool{},
		state:       &runnerv1.TaskState{Id: task.GetId(), Steps: make([]*runnerv1.StepState, max(steps, 0))},
	}
	for i := range r.state.Steps {
		r.state.Steps[i] = &runnerv1.StepState{Id: int64(i)}
	}
	r.jobCtx, r.jobCancel = context.WithCancel(ctx)
	r.loopCtx, r.loopStop = context.WithCancel(ctx)

	fields := task.GetContext().GetFields()
	for _, k := range []string{"token", "gitea_runtime_token", "actions_id_token_request_token"} {
		r.masks.add(fields[k].GetStringValue())
	}
	for _, v := range task.GetSecrets() {
		r.masks.add(v)
	}
	return r
}

// JobContext is the context act must run under. It is cancelled when Gitea
// answers a state report with a result the Reporter did not send (a user
// cancel, or the server ending the task), when the lifetime ends, and at the
// end of Close.
func (r *Reporter) JobContext() context.Context { return r.jobCtx }

// Start starts the flush loop: logs every LogInterval, at MaxBufferedRows
// and FirstRowDelay after a first row; the state every StateInterval; both
// at once on a step start or stop and on the job's result. It runs until
// Close or the end of the lifetime. Calls after the first, or after Close,
// do nothing.
func (r *Reporter) Start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || r.closed {
		return
	}
	r.started = true
	go r.loop()
}

// Logf appends a row of the runner's own (masked; one row per line). While
// steps run it is held back and appended after the last step, so that every
// step's rows stay contiguous.
func (r *Reporter) Logf(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.appendOwnLocked(r.opt.Now(), fmt.Sprintf(format, a...))
}

// AddMask hides v, its trimmed form and each line of it in every row not yet
// sent and every later row.
func (r *Reporter) AddMask(v string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.masks.add(v) {
		r.remaskLocked()
	}
}

// SetOutputs records the job's outputs. The first value per key wins, across
// calls. Keys over 255 bytes and values over 1 MiB are skipped with a
// warning row (Gitea would drop them). They are delivered with the next
// state report, and Close delivers them before the final result.
func (r *Reporter) SetOutputs(outputs map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(outputs))
	for k := range outputs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := outputs[k]
		switch {
		case len(k) > maxOutputKey:
			r.appendOwnLocked(r.opt.Now(), fmt.Sprintf("Warning: job output %q skipped: its key is %d bytes long (at most %d)", abbreviate(k), len(k), maxOutputKey))
		case len(v) > maxOutputValue:
			r.appendOwnLocked(r.opt.Now(), fmt.Sprintf("Warning: job output %q skipped: its value is %d bytes long (at most %d)", abbreviate(k), len(v), maxOutputValue))
		default:
			if _, ok := r.outputs[k]; !ok {
				r.outputs[k] = v
			}
		}
	}
}

func abbreviate(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64] + "…"
}

// Result returns the result Close put in its final UpdateTask (also when
// that call failed), or RESULT_UNSPECIFIED before it. Gitea may store
// another: CANCELLED for a task being cancelled, or the first result it got.
func (r *Reporter) Result() runnerv1.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.result
}

// Close ends the task in Gitea; it runs once (later calls return the first
// call's error) and uses a context detached from the lifetime, each call
// bounded by CallTimeout and each delivery by CloseTimeout. In order:
//
//  1. The result is Gitea's (a cancel), else act's jobResult, else
//     CANCELLED if JobContext was cancelled, else FAILURE with lastWords
//     defaulting to "Early termination". A job CANCELLED because the
//     lifetime ended, not by Gitea, gets StoppedWords as lastWords by
//     default. Steps without a result become CANCELLED; StoppedAt is now;
//     lastWords (masked) is the last row.
//  2. The flush loop is stopped and waited for.
//  3. The rest of the log goes with no_more (with an empty row if nothing is
//     left), retried until all of it is acknowledged.
//  4. A state report without a result, until Gitea lists every output.
//  5. The final UpdateTask, retried only on transport errors: any answer
//     ends it, so it reaches Gitea at most once unless a transport error
//     hid an answer.
//
// It returns an error only if step 3 or step 5 failed; the runner should
// then exit non-zero so that the gateway finalizes the task.
func (r *Reporter) Close(lastWords string) error {
	r.closeOnce.Do(func() { r.closeErr = r.close(lastWords) })
	return r.closeErr
}

func (r *Reporter) close(lastWords string) error {
	defer r.jobCancel()
	detached := context.WithoutCancel(r.ctx)
	phase := func(deliver func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(detached, r.opt.CloseTimeout)
		defer cancel()
		return deliver(ctx)
	}

	// 1. The result and the last rows.
	r.mu.Lock()
	r.closed = true
	now := r.opt.Now()
	res := r.serverResult
	if res == runnerv1.Result_RESULT_UNSPECIFIED {
		res = r.state.Result
	}
	if res == runnerv1.Result_RESULT_UNSPECIFIED {
		if r.jobCtx.Err() != nil {
			res = runnerv1.Result_RESULT_CANCELLED
		} else {
			res = runnerv1.Result_RESULT_FAILURE
			if lastWords == "" {
				lastWords = "Early termination"
			}
		}
	}
	if res == runnerv1.Result_RESULT_CANCELLED && r.serverResult == runnerv1.Result_RESULT_UNSPECIFIED &&
		r.ctx.Err() != nil && lastWords == "" {
		// Not Gitea's cancel: the runner itself was stopped. Say so.
		lastWords = StoppedWords
	}
	r.state.Result = res
	r.state.StoppedAt = timestamppb.New(now)
	r.endStepsLocked(runnerv1.Result_RESULT_CANCELLED, r.state.StoppedAt)
	r.drainDeferredLocked()
	if lastWords != "" {
		r.appendOwnLocked(now, lastWords)
	}
	started := r.started
	r.mu.Unlock()

	// 2. Stop the flush loop; an in-flight call is abandoned (a resend from
	// the acknowledged offset repairs a log call that got through).
	r.loopStop()
	if started {
		t := time.NewTimer(r.opt.CallTimeout)
		select {
		case <-r.loopDone:
		case <-t.C:
			r.warnf("reporter: the flush loop did not stop within %s", r.opt.CallTimeout)
		}
		t.Stop()
	}

	// 3. The log, archived.
	logErr := phase(func(ctx context.Context) error { return r.finishLog(ctx, now) })
	// 4. The outputs.
	_ = phase(func(ctx context.Context) error { r.deliverOutputs(ctx); return nil })
	// 5. The result.
	finalErr := phase(r.sendFinal)
	return errors.Join(logErr, finalErr)
}

// finishLog sends the rest of the log with no_more until Gitea acknowledges
// every row.
func (r *Reporter) finishLog(ctx context.Context, now time.Time) error {
	r.mu.Lock()
	if len(r.rows) == 0 {
		// Servers before go-gitea/gitea#37631 never archive an empty batch.
		r.rows = append(r.rows, &runnerv1.LogRow{Time: timestamppb.New(now)})
	}
	r.mu.Unlock()
	for {
		err := r.sendLog(ctx, true)
		if err == nil {
			r.mu.Lock()
			done := len(r.rows) == 0
			r.mu.Unlock()
			if done {
				return nil
			}
			err = r.errorf("reporter: the final log batch was not fully acknowledged")
		}
		if permanent(err) {
			return err
		}
		if !r.pause(ctx) {
			return r.errorf("reporter: archiving the log of task %d: %w", r.taskID, err)
		}
	}
}

// deliverOutputs reports the state without a result until Gitea lists every
// output as stored. Failing is logged, not returned: the final call still
// carries the outputs not acknowledged.
func (r *Reporter) deliverOutputs(ctx context.Context) {
	for answered := 0; ; {
		r.mu.Lock()
		pending := r.pendingOutputsLocked()
		r.mu.Unlock()
		if len(pending) == 0 {
			return
		}
		if answered >= 3 {
			r.warnf("reporter: Gitea did not store the outputs %v of task %d", slices.Sorted(maps.Keys(pending)), r.taskID)
			return
		}
		err := r.sendState(ctx, false)
		if err == nil {
			answered++
			continue
		}
		r.warnf("reporter: delivering the outputs of task %d: %v", r.taskID, err)
		if !r.pause(ctx) {
			return
		}
	}
}

// sendFinal sends the result once; it retries only transport errors.
func (r *Reporter) sendFinal(ctx context.Context) error {
	for {
		err := r.sendState(ctx, true)
		if err == nil {
			return nil
		}
		if !transport(err) || !r.pause(ctx) {
			return r.errorf("reporter: final state of task %d: %w", r.taskID, err)
		}
	}
}

// pause waits RetryDelay; false if ctx ends first.
func (r *Reporter) pause(ctx context.Context) bool {
	t := time.NewTimer(r.opt.RetryDelay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// loop is the flush loop Start runs.
func (r *Reporter) loop() {
	defer close(r.loopDone)
	ctx := r.loopCtx
	logTick := time.NewTicker(r.opt.LogInterval)
	defer logTick.Stop()
	stateTick := time.NewTicker(r.opt.StateInterval)
	defer stateTick.Stop()
	firstRow := time.NewTimer(r.opt.FirstRowDelay)
	firstRow.Stop()
	armed := false

	flushLog := func() {
		if err := r.sendLog(ctx, false); err != nil && ctx.Err() == nil {
			r.warnf("%v (will retry)", err)
		}
	}
	flushState := func() {
		if err := r.sendState(ctx, false); err != nil && ctx.Err() == nil {
			r.warnf("%v (will retry)", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-logTick.C:
			flushLog()
		case <-stateTick.C:
			flushLog()
			flushState()
		case <-firstRow.C:
			armed = false
			flushLog()
		case <-r.wake:
			r.mu.Lock()
			urgent, fresh := r.urgent, r.fresh
			r.urgent = false
			r.mu.Unlock()
			switch {
			case urgent:
				flushLog()
				flushState()
			case fresh >= r.opt.MaxBufferedRows:
				flushLog()
			case fresh > 0 && !armed:
				firstRow.Reset(r.opt.FirstRowDelay)
				armed = true
			}
		}
		r.mu.Lock()
		fresh := r.fresh
		r.mu.Unlock()
		if armed && fresh == 0 {
			firstRow.Stop()
			armed = false
		}
	}
}

// signalLocked wakes the flush loop without blocking.
func (r *Reporter) signalLocked() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Reporter) acquire(ctx context.Context) error {
	select {
	case r.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Reporter) release() { <-r.sem }

// sendLog sends the rows not yet acknowledged, from the acknowledged
// offset, then drops what Gitea acknowledged. With noMore it archives the
// log.
func (r *Reporter) sendLog(ctx context.Context, noMore bool) error {
	if err := r.acquire(ctx); err != nil {
		return r.errorf("reporter: update log of task %d: %w", r.taskID, err)
	}
	defer r.release()

	r.mu.Lock()
	offset := r.logOffset
	rows := slices.Clone(r.rows)
	r.fresh = 0
	r.mu.Unlock()
	if len(rows) == 0 && !noMore {
		return nil
	}

	cctx, cancel := context.WithTimeout(ctx, r.opt.CallTimeout)
	resp, err := r.client.UpdateLog(cctx, &runnerv1.UpdateLogRequest{TaskId: r.taskID, Index: offset, Rows: rows, NoMore: noMore})
	cancel()
	if err != nil {
		return r.errorf("reporter: update log of task %d (%d rows from %d): %w", r.taskID, len(rows), offset, err)
	}
	ack := resp.GetAckIndex()
	if ack < offset {
		return &maskedError{msg: fmt.Sprintf("reporter: update log of task %d: Gitea acknowledged %d rows, fewer than the %d it had acknowledged", r.taskID, ack, offset), err: errAckBelowOffset}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(ack-offset, int64(len(rows)))
	r.rows = slices.Clone(r.rows[n:])
	r.logOffset = ack
	return nil
}

// errAckBelowOffset: Gitea lost rows it had acknowledged; resending cannot help.
var errAckBelowOffset = errors.New("acknowledged index below the offset")

// sendState reports the full state: with its result only when final, and
// with the outputs Gitea has not listed as stored. It records Gitea's
// stored outputs and, for a non-final call, a result Gitea answers.
func (r *Reporter) sendState(ctx context.Context, final bool) error {
	if err := r.acquire(ctx); err != nil {
		return r.errorf("reporter: update task %d: %w", r.taskID, err)
	}
	defer r.release()

	r.mu.Lock()
	if final && r.serverResult != runnerv1.Result_RESULT_UNSPECIFIED {
		// Gitea's view wins: it keeps a cancelled or finished task's result.
		r.state.Result = r.serverResult
	}
	state := proto.Clone(r.state).(*runnerv1.TaskState)
	if !final {
		state.Result = runnerv1.Result_RESULT_UNSPECIFIED
	}
	req := &runnerv1.UpdateTaskRequest{State: state, Outputs: r.pendingOutputsLocked()}
	if final {
		r.result = state.Result
	}
	r.mu.Unlock()

	cctx, cancel := context.WithTimeout(ctx, r.opt.CallTimeout)
	resp, err := r.client.UpdateTask(cctx, req)
	cancel()
	if err != nil {
		return r.errorf("reporter: update task %d: %w", r.taskID, err)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range resp.GetSentOutputs() {
		r.sentOutputs[k] = true
	}
	if got := resp.GetState().GetResult(); !final && got != runnerv1.Result_RESULT_UNSPECIFIED && r.serverResult == runnerv1.Result_RESULT_UNSPECIFIED {
		r.serverResult = got
		r.jobCancel()
		if !r.closed {
			r.appendOwnLocked(r.opt.Now(), fmt.Sprintf("Gitea ended the task (%s): stopping the job", resultName(got)))
		}
	}
	return nil
}

func (r *Reporter) pendingOutputsLocked() map[string]string {
	var out map[string]string
	for k, v := range r.outputs {
		if !r.sentOutputs[k] {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// transport reports whether err is a transport failure, after which the
// same call may be retried: Connect's unavailable or deadline_exceeded (a
// Gitea answer is always unknown), or a per-call timeout.
func transport(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// permanent reports whether resending the same log batch cannot succeed:
// Gitea lost acknowledged rows, archived the log already, or refuses the
// caller (an unregistered runner, or not the one that claimed the task).
func permanent(err error) bool {
	if errors.Is(err, errAckBelowOffset) {
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeAlreadyExists, connect.CodeUnauthenticated, connect.CodePermissionDenied:
		return true
	}
	// Gitea's own answers reach a Connect client as unknown, with the real
	// code in the text.
	msg := err.Error()
	for _, s := range []string{"code = AlreadyExists", "code = Unauthenticated", "code = PermissionDenied", "invalid runner for task"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// maskedError is an error whose text was masked. It unwraps to its cause
// for errors.Is and errors.As (and connect.CodeOf).
type maskedError struct {
	msg string
	err error
}

func (e *maskedError) Error() string { return e.msg }
func (e *maskedError) Unwrap() error { return e.err }

// errorf is fmt.Errorf whose text is masked.
func (r *Reporter) errorf(format string, a ...any) error {
	err := fmt.Errorf(format, a...)
	r.mu.Lock()
	msg := r.masks.mask(err.Error())
	r.mu.Unlock()
	return &maskedError{msg: msg, err: errors.Unwrap(err)}
}

// warnf logs a masked warning to Options.Logger.
func (r *Reporter) warnf(format string, a ...any) {
	r.mu.Lock()
	msg := r.masks.mask(fmt.Sprintf(format, a...))
	r.mu.Unlock()
	r.opt.Logger.Warn(msg)
}

func resultName(res runnerv1.Result) string {
	switch res {
	case runnerv1.Result_RESULT_SUCCESS:
		return "success"
	case runnerv1.Result_RESULT_FAILURE:
		return "failure"
	case runnerv1.Result_RESULT_CANCELLED:
		return "cancelled"
	case runnerv1.Result_RESULT_SKIPPED:
		return "skipped"
	}
	return "unspecified"
}
