package reporter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
)

// secretParts is every string that must never reach Gitea or an error.
var secretParts = []string{
	secToken, secRuntime, secOIDC, secPass,
	"-----BEGIN TEST KEY-----", "AAAAfirstkeyline", "BBBBsecondkeyline", "-----END TEST KEY-----",
}

func assertNoSecrets(t *testing.T, where string, texts []string, extra ...string) {
	t.Helper()
	for _, text := range texts {
		for _, s := range append(slices.Clone(secretParts), extra...) {
			if strings.Contains(text, s) {
				t.Errorf("%s holds the secret %q: %q", where, s, text)
			}
		}
	}
}

// withoutSentinel drops the empty row Close sends when nothing else was
// left for the no_more batch.
func withoutSentinel(rows []string) []string {
	if len(rows) > 0 && rows[len(rows)-1] == "" {
		return rows[:len(rows)-1]
	}
	return rows
}

func TestMasking(t *testing.T) {
	h := newHarness(t, 1, map[string]string{"OVER1": "xyzSECRET", "OVER2": "SECRETtail"}, nil)
	a := h.act
	h.r.Logf("received task 7 with token %s", secToken)
	a.job.Infof("\u2B50 Run Main echo %s", secToken) // act interpolates secrets into display names
	s0 := a.step(0, "Main")
	raw(s0, "token="+secToken)
	raw(s0, "runtime "+secRuntime)
	raw(s0, "oidc "+secOIDC)
	raw(s0, "pass "+secPass)
	raw(s0, "AAAAfirstkeyline")
	raw(s0, "  BBBBsecondkeyline  ")
	s0.Errorf("whole key: %s", secKey)
	raw(s0, "early dyn-secret-42") // printed before its add-mask, not yet sent
	raw(s0, "::add-mask::dyn-secret-42")
	raw(s0, "later dyn-secret-42")
	h.r.AddMask("api-added-77")
	raw(s0, "x api-added-77")
	raw(s0, "xyzSECRETtail")
	success(s0, "x")
	a.jobResult("success")
	if err := h.r.Close("last words " + secToken + " " + secRuntime); err != nil {
		t.Fatalf("Close: %v", err)
	}

	rows := h.fake.contents()
	assertNoSecrets(t, "a stored row", rows, "dyn-secret-42", "api-added-77", "SECRET")
	for _, want := range []string{
		"received task 7 with token ***", "\u2B50 Run Main echo ***", "token=***", "runtime ***", "oidc ***", "pass ***",
		"***", "  ***  ", "whole key: ***", "early ***", "later ***", "x ***", "last words *** ***",
	} {
		if !slices.Contains(rows, want) {
			t.Errorf("no row %q in %q", want, rows)
		}
	}
	if slices.ContainsFunc(rows, func(r string) bool { return strings.Contains(r, "add-mask") }) {
		t.Errorf("an add-mask row was kept: %q", rows)
	}
}

func TestErrorsAndWarningsAreMasked(t *testing.T) {
	h := newHarness(t, 1, nil, func(o *Options) {
		o.CloseTimeout = 50 * time.Millisecond
		o.LogInterval = 5 * time.Millisecond
	})
	h.fake.set(func(f *fakeGitea) {
		f.logErr = giteaError("Unauthenticated", "unregistered runner "+secToken)
		f.finalErr = giteaError("Internal", "update task: bad token "+secRuntime)
	})
	h.r.Start()
	h.act.job.Infof("a row")
	waitFor(t, "a flush warning", func() bool { return strings.Contains(h.logs.String(), "will retry") })
	err := h.r.Close("")
	if err == nil {
		t.Fatal("Close succeeded although neither the log nor the result was delivered")
	}
	assertNoSecrets(t, "Close's error", []string{err.Error()})
	assertNoSecrets(t, "the reporter's warnings", []string{h.logs.String()})
	if !strings.Contains(err.Error(), "***") {
		t.Errorf("Close's error %q does not show the masked cause", err)
	}
	if connect.CodeOf(err) != connect.CodeUnknown {
		t.Errorf("Close's error lost its cause: code %v", connect.CodeOf(err))
	}
}

func TestFlushing(t *testing.T) {
	t.Run("at MaxBufferedRows", func(t *testing.T) {
		h := newHarness(t, 0, nil, func(o *Options) { o.MaxBufferedRows = 5 })
		h.r.Start()
		for i := range 4 {
			h.act.job.Infof("row %d", i)
		}
		time.Sleep(30 * time.Millisecond)
		if n := len(h.fake.contents()); n != 0 {
			t.Fatalf("%d rows flushed before MaxBufferedRows", n)
		}
		h.act.job.Infof("row 4")
		waitFor(t, "5 rows", func() bool { return len(h.fake.contents()) == 5 })
	})
	t.Run("FirstRowDelay after the first row", func(t *testing.T) {
		const delay = 40 * time.Millisecond
		h := newHarness(t, 0, nil, func(o *Options) { o.FirstRowDelay = delay })
		h.r.Start()
		start := time.Now()
		h.act.job.Infof("row")
		waitFor(t, "the row", func() bool { return len(h.fake.contents()) == 1 })
		if d := time.Since(start); d < delay {
			t.Fatalf("flushed after %v, before FirstRowDelay %v", d, delay)
		}
	})
	t.Run("every LogInterval", func(t *testing.T) {
		h := newHarness(t, 0, nil, func(o *Options) { o.LogInterval = 10 * time.Millisecond })
		h.r.Start()
		h.act.job.Infof("row")
		waitFor(t, "the row", func() bool { return len(h.fake.contents()) == 1 })
	})
	t.Run("urgently on a step start and stop", func(t *testing.T) {
		h := newHarness(t, 2, nil, nil)
		h.r.Start()
		s0 := h.act.step(0, "Main")
		raw(s0, "zero")
		waitFor(t, "step 0 started, with its row", func() bool {
			st := h.fake.storedSteps()
			return len(st) == 2 && st[0].GetStartedAt() != nil && len(h.fake.contents()) == 1
		})
		success(s0, "x")
		waitFor(t, "step 0's result", func() bool {
			st := h.fake.storedSteps()
			return len(st) == 2 && st[0].GetResult() == S
		})
	})
}

func TestLogRetriedFromAck(t *testing.T) {
	tests := []struct {
		name                string
		failBefore, failAft int
	}{
		{"call lost", 3, 0},
		{"answer lost", 0, 3},
		{"both", 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil, func(o *Options) { o.LogInterval = 3 * time.Millisecond })
			h.fake.set(func(f *fakeGitea) { f.failLogBefore, f.failLogAfter = tt.failBefore, tt.failAft })
			h.r.Start()
			s0 := h.act.step(0, "Main")
			var want []string
			for i := range 40 {
				line := fmt.Sprintf("line %d", i)
				raw(s0, line)
				want = append(want, line)
				if i%5 == 0 {
					time.Sleep(2 * time.Millisecond)
				}
			}
			success(s0, "x")
			h.act.jobResult("success")
			want = append(want, "\U0001F3C1  Job succeeded")
			if err := h.r.Close(""); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if got := withoutSentinel(h.fake.contents()); !slices.Equal(got, want) {
				t.Fatalf("stored log = %q\nwant %q", got, want)
			}
			snap := h.fake.snapshot()
			if snap.violations != nil {
				t.Fatalf("violations: %q", snap.violations)
			}
			h.fake.set(func(f *fakeGitea) {
				if f.failLogBefore+f.failLogAfter != 0 {
					t.Errorf("the failures were not all exercised")
				}
			})
			if st := h.fake.storedSteps()[0]; st.GetLogIndex() != 0 || st.GetLogLength() != 40 {
				t.Fatalf("step 0 at %d+%d, want 0+40", st.GetLogIndex(), st.GetLogLength())
			}
		})
	}
}

func TestAckBelowOffsetIsAnError(t *testing.T) {
	h := newHarness(t, 0, nil, func(o *Options) { o.CloseTimeout = 10 * time.Second })
	h.act.job.Infof("one")
	h.act.job.Infof("two")
	if err := h.r.sendLog(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	h.fake.set(func(f *fakeGitea) { f.rows = f.rows[:1] }) // Gitea lost an acknowledged row
	h.act.job.Infof("three")
	err := h.r.sendLog(context.Background(), false)
	if !errors.Is(err, errAckBelowOffset) {
		t.Fatalf("sendLog = %v, want errAckBelowOffset", err)
	}
	start := time.Now()
	if err := h.r.Close(""); err == nil {
		t.Fatal("Close succeeded with a log Gitea lost rows of")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close retried a hopeless log for %v", d)
	}
}

func TestHeartbeat(t *testing.T) {
	const interval = 15 * time.Millisecond
	h := newHarness(t, 2, nil, func(o *Options) { o.StateInterval = interval })
	start := time.Now()
	h.r.Start()
	waitFor(t, "3 heartbeats", func() bool { return h.fake.heartbeats() >= 3 })
	if d := time.Since(start); d < 3*interval-5*time.Millisecond {
		t.Fatalf("3 heartbeats after %v: not one per StateInterval %v", d, interval)
	}
	// After act's result the heartbeat still carries no result.
	s0, s1 := h.act.step(0, "Main"), h.act.step(1, "Main")
	success(s0, "x")
	success(s1, "y")
	h.act.jobResult("success")
	n := h.fake.heartbeats()
	waitFor(t, "3 more heartbeats", func() bool { return h.fake.heartbeats() >= n+3 })
	snap := h.fake.snapshot()
	if snap.finalAttempts != 0 {
		t.Fatalf("a heartbeat carried a result")
	}
	if snap.violations != nil {
		t.Fatalf("violations: %q", snap.violations)
	}
	last := snap.taskReqs[len(snap.taskReqs)-1]
	if got := results(last.GetState().GetSteps()); !slices.Equal(got, []runnerv1.Result{S, S}) {
		t.Fatalf("heartbeat steps = %v", got)
	}
}

func TestCancel(t *testing.T) {
	for _, handshake := range []bool{true, false} {
		t.Run(fmt.Sprintf("handshake=%v", handshake), func(t *testing.T) {
			h := newHarness(t, 2, nil, func(o *Options) { o.StateInterval = 5 * time.Millisecond })
			h.r.Start()
			s0 := h.act.step(0, "Main")
			run(s0, "sleep 100")
			raw(s0, "working")
			h.fake.cancel(handshake)
			select {
			case <-h.r.JobContext().Done():
			case <-time.After(3 * time.Second):
				t.Fatal("JobContext not cancelled after Gitea answered CANCELLED")
			}
			// act kills the step, runs the post stages, then claims success.
			failure(s0, "sleep 100")
			s0.Errorf("context canceled")
			h.act.step(0, "Post").Infof("post after cancel")
			h.act.job.Infof("Cleaning up container for job build")
			h.act.jobResult("success")
			if err := h.r.Close(""); err != nil {
				t.Fatalf("Close: %v", err)
			}
			snap := h.fake.snapshot()
			if h.r.Result() != C || snap.status != C {
				t.Fatalf("result: sent %v, Gitea %v; want CANCELLED", h.r.Result(), snap.status)
			}
			if snap.finalApplied != 1 {
				t.Fatalf("%d final calls", snap.finalApplied)
			}
			if got := results(h.fake.claimedSteps()); !slices.Equal(got, []runnerv1.Result{F, C}) {
				t.Fatalf("steps = %v", got)
			}
			_, _, complete := h.fake.layout()
			complete = withoutSentinel(complete)
			want := []string{"Gitea ended the task (cancelled): stopping the job", "post after cancel", "Cleaning up container for job build"}
			if !slices.Equal(complete, want) {
				t.Fatalf("complete rows = %q, want %q", complete, want)
			}
			if err := h.fake.contiguous(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestLifetimeCancelIgnoresActSuccess(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	fake := newFake(testTaskID, 1)
	r := New(ctx, fake, testTask(nil), 1, testOptions(&syncBuffer{}, nil))
	a := newActLog(r)
	raw(a.step(0, "Main"), "working")
	cancel()
	<-r.JobContext().Done()
	a.jobResult("success") // act's claim after its context ended
	if err := r.Close(""); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if r.Result() != C {
		t.Fatalf("result %v, want CANCELLED", r.Result())
	}
	if rows := fake.contents(); len(rows) == 0 || rows[len(rows)-1] != StoppedWords {
		t.Fatalf("last row %q, want the runner's stop said (%q)", rows, StoppedWords)
	}
}

func TestCloseResult(t *testing.T) {
	tests := []struct {
		name      string
		script    func(h *harness)
		lastWords string
		want      runnerv1.Result
		wantSteps []runnerv1.Result
		wantLast  []string
	}{{
		name: "act's result",
		script: func(h *harness) {
			success(h.act.step(0, "Main"), "x")
			skip(h.act.step(1, "Main"), "y")
			h.act.jobResult("failure")
		},
		want:      F,
		wantSteps: []runnerv1.Result{S, SK},
		wantLast:  []string{"\U0001F3C1  Job failed"},
	}, {
		name:      "early termination",
		script:    func(h *harness) { raw(h.act.step(0, "Main"), "working") },
		want:      F,
		wantSteps: []runnerv1.Result{C, C},
		wantLast:  []string{"Early termination"},
	}, {
		name:      "a panic as last words",
		script:    func(h *harness) { raw(h.act.step(0, "Main"), "working") },
		lastWords: "panic: boom\n\ngoroutine 1 [running]:\n",
		want:      F,
		wantSteps: []runnerv1.Result{C, C},
		wantLast:  []string{"panic: boom", "", "goroutine 1 [running]:"},
	}, {
		name:      "job context cancelled",
		script:    func(h *harness) { raw(h.act.step(0, "Main"), "working"); h.r.jobCancel() },
		want:      C,
		wantSteps: []runnerv1.Result{C, C},
		wantLast:  []string{""}, // the sentinel row: nothing was left to send
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 2, nil, nil)
			tt.script(h)
			if tt.name == "job context cancelled" {
				if err := h.r.sendLog(context.Background(), false); err != nil {
					t.Fatal(err)
				}
			}
			if err := h.r.Close(tt.lastWords); err != nil {
				t.Fatalf("Close: %v", err)
			}
			snap := h.fake.snapshot()
			if h.r.Result() != tt.want || snap.status != tt.want {
				t.Fatalf("result: sent %v, Gitea %v; want %v", h.r.Result(), snap.status, tt.want)
			}
			if got := results(h.fake.storedSteps()); !slices.Equal(got, tt.wantSteps) {
				t.Fatalf("steps = %v, want %v", got, tt.wantSteps)
			}
			rows := h.fake.contents()
			if got := rows[max(0, len(rows)-len(tt.wantLast)):]; !slices.Equal(got, tt.wantLast) {
				t.Fatalf("last rows = %q, want %q", got, tt.wantLast)
			}
			final := snap.taskReqs[len(snap.taskReqs)-1].GetState()
			if final.GetStoppedAt() == nil || final.GetResult() != tt.want {
				t.Fatalf("final state %v lacks StoppedAt or the result", final)
			}
		})
	}
}

func TestOutputs(t *testing.T) {
	tests := []struct {
		name           string
		failTaskBefore int
	}{{"delivered", 0}, {"delivered after a transport error", 2}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil, nil)
			h.fake.set(func(f *fakeGitea) { f.failTaskBefore = tt.failTaskBefore })
			success(h.act.step(0, "Main"), "x")
			h.act.jobResult("success")
			longKey := strings.Repeat("k", maxOutputKey+1)
			h.r.SetOutputs(map[string]string{
				"a": "1", "b": "2", longKey: "x", "big": strings.Repeat("v", maxOutputValue+1),
				"max": strings.Repeat("v", maxOutputValue), strings.Repeat("m", maxOutputKey): "edge",
			})
			h.r.SetOutputs(map[string]string{"a": "changed", "c": "3"}) // the first value wins
			if err := h.r.Close(""); err != nil {
				t.Fatalf("Close: %v", err)
			}
			snap := h.fake.snapshot()
			want := map[string]string{"a": "1", "b": "2", "c": "3", "max": strings.Repeat("v", maxOutputValue), strings.Repeat("m", maxOutputKey): "edge"}
			if !maps.Equal(snap.outputs, want) {
				t.Fatalf("stored outputs: keys %v", slices.Sorted(maps.Keys(snap.outputs)))
			}
			if !slices.Equal(snap.outputsAtFinal, slices.Sorted(maps.Keys(want))) {
				t.Fatalf("outputs stored before the final call: %v", snap.outputsAtFinal)
			}
			if !snap.archivedAtFinal {
				t.Fatal("the final call came before the log was archived")
			}
			rows := h.fake.contents()
			var warnings int
			for _, r := range rows {
				if strings.HasPrefix(r, "Warning: job output") {
					warnings++
				}
			}
			if warnings != 2 {
				t.Fatalf("%d warning rows, want 2: %q", warnings, rows)
			}
		})
	}
}

func TestCloseDelivery(t *testing.T) {
	tests := []struct {
		name         string
		setup        func(f *fakeGitea)
		wantErr      string
		wantAttempts int
		wantApplied  int
		maxLogCalls  int // 0: any
	}{{
		name:         "clean",
		wantAttempts: 1, wantApplied: 1,
	}, {
		name:         "final retried on transport errors",
		setup:        func(f *fakeGitea) { f.failFinalBefore = 2 },
		wantAttempts: 3, wantApplied: 1,
	}, {
		name: "final retried on deadline_exceeded",
		setup: func(f *fakeGitea) {
			f.failFinalBefore = 1
			f.transportErr = connect.NewError(connect.CodeDeadlineExceeded, errors.New("context deadline exceeded"))
		},
		wantAttempts: 2, wantApplied: 1,
	}, {
		name:         "final not retried on Gitea's error",
		setup:        func(f *fakeGitea) { f.finalErr = giteaError("Internal", "update task: boom") },
		wantErr:      "final state",
		wantAttempts: 1, wantApplied: 0,
	}, {
		name:         "log undeliverable",
		setup:        func(f *fakeGitea) { f.failLogBefore = 1 << 30 },
		wantErr:      "archiving the log",
		wantAttempts: 1, wantApplied: 1,
	}, {
		name:         "log refused: no retries",
		setup:        func(f *fakeGitea) { f.logErr = giteaError("Unauthenticated", "unregistered runner") },
		wantErr:      "unregistered runner",
		wantAttempts: 1, wantApplied: 1, maxLogCalls: 1,
	}, {
		name:         "log and final transport errors then success",
		setup:        func(f *fakeGitea) { f.failLogBefore = 3; f.failLogAfter = 1; f.failFinalBefore = 1 },
		wantAttempts: 2, wantApplied: 1,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil, func(o *Options) { o.CloseTimeout = 200 * time.Millisecond })
			if tt.setup != nil {
				h.fake.set(tt.setup)
			}
			raw(h.act.step(0, "Main"), "out")
			success(h.act.step(0, "Main"), "x")
			h.act.jobResult("success")
			err := h.r.Close("")
			if n := len(h.fake.snapshot().logReqs); tt.maxLogCalls > 0 && n > tt.maxLogCalls {
				t.Fatalf("%d UpdateLogs, want at most %d", n, tt.maxLogCalls)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Close: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Close = %v, want an error about %q", err, tt.wantErr)
			}
			if again := h.r.Close("again"); fmt.Sprint(again) != fmt.Sprint(err) {
				t.Fatalf("second Close = %v, want the first's %v", again, err)
			}
			snap := h.fake.snapshot()
			if snap.finalAttempts != tt.wantAttempts || snap.finalApplied != tt.wantApplied {
				t.Fatalf("final calls: %d attempted, %d processed; want %d, %d", snap.finalAttempts, snap.finalApplied, tt.wantAttempts, tt.wantApplied)
			}
			if tt.wantErr == "" {
				if !snap.archived || !snap.archivedAtFinal {
					t.Fatal("the log was not archived before the final call")
				}
				if got := h.fake.contents(); !slices.Equal(got, []string{"out", "\U0001F3C1  Job succeeded"}) {
					t.Fatalf("stored log = %q", got)
				}
				last := snap.logReqs[len(snap.logReqs)-1]
				if !last.GetNoMore() || len(last.GetRows()) == 0 {
					t.Fatalf("last UpdateLog: no_more=%v with %d rows", last.GetNoMore(), len(last.GetRows()))
				}
			}
		})
	}
}

func TestCloseSentinelRow(t *testing.T) {
	h := newHarness(t, 0, nil, func(o *Options) { o.FirstRowDelay = time.Millisecond })
	h.r.Start()
	h.act.jobResult("success")
	waitFor(t, "the flush", func() bool { return len(h.fake.contents()) == 1 })
	if err := h.r.Close(""); err != nil {
		t.Fatal(err)
	}
	snap := h.fake.snapshot()
	last := snap.logReqs[len(snap.logReqs)-1]
	if !last.GetNoMore() || len(last.GetRows()) != 1 || last.GetRows()[0].GetContent() != "" {
		t.Fatalf("final UpdateLog = %v, want no_more with one empty row", last)
	}
	if !snap.archived {
		t.Fatal("log not archived")
	}
}

func TestCloseStopsEverything(t *testing.T) {
	h := newHarness(t, 1, nil, func(o *Options) {
		o.StateInterval = 2 * time.Millisecond
		o.LogInterval = 2 * time.Millisecond
	})
	h.r.Start()
	waitFor(t, "a heartbeat", func() bool { return h.fake.heartbeats() > 0 })
	if err := h.r.Close(""); err != nil {
		t.Fatal(err)
	}
	before := h.fake.snapshot()
	raw(h.act.step(0, "Main"), "after close")
	h.r.Logf("after close")
	time.Sleep(20 * time.Millisecond)
	after := h.fake.snapshot()
	if len(after.logReqs) != len(before.logReqs) || len(after.taskReqs) != len(before.taskReqs) {
		t.Fatal("calls after Close")
	}
	if h.r.JobContext().Err() == nil {
		t.Fatal("JobContext still live after Close")
	}
	h.r.Start() // a no-op now
}

// scriptedLog answers UpdateLog with acks computed by ack(index, rows).
type scriptedLog struct {
	fakeGitea
	ack    func(index int64, rows int) int64
	during func() // runs inside the first call
	reqs   []*runnerv1.UpdateLogRequest
}

func (s *scriptedLog) UpdateLog(_ context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	s.reqs = append(s.reqs, req)
	if len(s.reqs) == 1 && s.during != nil {
		s.during()
	}
	return &runnerv1.UpdateLogResponse{AckIndex: s.ack(req.GetIndex(), len(req.GetRows()))}, nil
}

func TestSendLogFollowsAck(t *testing.T) {
	tests := []struct {
		name       string
		ack        func(index int64, rows int) int64
		during     bool  // a row arrives during the first call
		wantIndex  int64 // of the second request
		wantRows   []string
		wantOffset int64
	}{
		{"all acknowledged", func(i int64, n int) int64 { return i + int64(n) }, false, 3, []string{"d"}, 4},
		{"partly acknowledged", func(i int64, n int) int64 { return i + 1 }, false, 1, []string{"b", "c", "d"}, 2},
		{"more than sent", func(i int64, n int) int64 { return i + int64(n) + 2 }, false, 5, []string{"d"}, 8},
		{"more than sent, drop clamped to the sent rows", func(i int64, n int) int64 { return i + int64(n) + 2 }, true, 5, []string{"meanwhile", "d"}, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &scriptedLog{ack: tt.ack}
			r := New(context.Background(), c, &runnerv1.Task{Id: 1}, 0, testOptions(&syncBuffer{}, nil))
			if tt.during {
				c.during = func() { r.Logf("meanwhile") }
			}
			r.Logf("a\nb\nc")
			if err := r.sendLog(context.Background(), false); err != nil {
				t.Fatal(err)
			}
			r.Logf("d")
			if err := r.sendLog(context.Background(), false); err != nil {
				t.Fatal(err)
			}
			second := c.reqs[1]
			var got []string
			for _, row := range second.GetRows() {
				got = append(got, row.GetContent())
			}
			if second.GetIndex() != tt.wantIndex || !slices.Equal(got, tt.wantRows) {
				t.Fatalf("second UpdateLog = index %d rows %q, want %d %q", second.GetIndex(), got, tt.wantIndex, tt.wantRows)
			}
			if r.logOffset != tt.wantOffset {
				t.Fatalf("offset %d, want %d", r.logOffset, tt.wantOffset)
			}
		})
	}
}

func TestAddMaskHidesUnsentRows(t *testing.T) {
	tests := []struct {
		name    string
		flushed bool // the early row left before the add-mask
		want    string
	}{
		{"not yet sent", false, "early ***"},
		{"already sent", true, "early dyn-secret-42"}, // as on GitHub: a mask is not retroactive
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil, nil)
			s0 := h.act.step(0, "Main")
			raw(s0, "early dyn-secret-42")
			if tt.flushed {
				if err := h.r.sendLog(context.Background(), false); err != nil {
					t.Fatal(err)
				}
			}
			raw(s0, "::add-mask::dyn-secret-42")
			raw(s0, "later dyn-secret-42")
			success(s0, "x")
			h.act.jobResult("success")
			if err := h.r.Close(""); err != nil {
				t.Fatal(err)
			}
			want := []string{tt.want, "later ***", "\U0001F3C1  Job succeeded"}
			if got := h.fake.contents(); !slices.Equal(got, want) {
				t.Fatalf("stored log = %q, want %q", got, want)
			}
		})
	}
}
