package reporter

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nektos/act/pkg/model"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/structpb"
)

const testTaskID = 7

// actLog logs the way act's job logger does (pkg/runner/logger.go): a
// logrus logger at Trace with the reporter as its hook and the job's
// fields; steps add withStepLogger's fields, composite sub-steps extend
// stepID (WithCompositeStepLogger), output lines carry raw_output.
type actLog struct{ job *logrus.Entry }

func newActLog(r *Reporter) *actLog {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.TraceLevel)
	l.AddHook(r)
	return &actLog{job: l.WithFields(logrus.Fields{"job": "build", "jobID": "build", "dryrun": false, "matrix": map[string]any{}})}
}

// step is act's logger for stage ("Pre", "Main", "Post") of step n.
func (a *actLog) step(n int, stage string) *logrus.Entry {
	return a.job.WithFields(logrus.Fields{
		"stepNumber": n, "step": "echo " + strconv.Itoa(n), "stepID": []string{strconv.Itoa(n)}, "stage": stage,
	})
}

// sub is act's logger for a sub-step id of the composite action at step n.
func (a *actLog) sub(n int, id string) *logrus.Entry {
	return a.step(n, "Main").WithField("stepID", []string{strconv.Itoa(n), id})
}

// raw is the logger of a step's output lines; act keeps the line's "\n".
func raw(e *logrus.Entry, line string) { e.WithField("raw_output", true).Infof("%s\n", line) }

// The messages act logs around a step (pkg/runner/step.go).
func run(e *logrus.Entry, what string) { e.Infof("\u2B50 Run Main %s", what) }
func success(e *logrus.Entry, what string) {
	e.WithField("stepResult", model.StepStatusSuccess).Infof("  \u2705  Success - Main %s", what)
}
func failure(e *logrus.Entry, what string) {
	e.WithField("stepResult", model.StepStatusFailure).Errorf("  \u274C  Failure - Main %s", what)
}
func skip(e *logrus.Entry, what string) {
	e.WithField("stepResult", model.StepStatusSkipped).Debugf("Skipping step '%s' due to 'false'", what)
}

// jobResult is job_executor.go's last row.
func (a *actLog) jobResult(res string) {
	msg := "succeeded"
	if res != "success" {
		msg = "failed"
	}
	a.job.WithField("jobResult", res).Infof("\U0001F3C1  Job %s", msg)
}

// Secrets of testTask.
const (
	secToken   = "0123456789abcdef0123456789abcdef01234567"
	secRuntime = "eyJhbGciOiJIUzI1NiJ9.eyJzY3AiOiJBY3Rpb25zLlJlc3VsdHMifQ.c2lnbmF0dXJl"
	secOIDC    = "oidc-request-token-55555"
	secPass    = "p@ss w0rd!"
	secKey     = "-----BEGIN TEST KEY-----\nAAAAfirstkeyline\r\n  BBBBsecondkeyline  \n-----END TEST KEY-----\n"
)

func testTask(extra map[string]string) *runnerv1.Task {
	ctx, err := structpb.NewStruct(map[string]any{
		"token": secToken, "gitea_runtime_token": secRuntime, "actions_id_token_request_token": secOIDC,
		"repository": "alice/demo", "run_id": "42",
	})
	if err != nil {
		panic(err)
	}
	secrets := map[string]string{"GITEA_TOKEN": secToken, "GITHUB_TOKEN": secToken, "PASS": secPass, "KEY": secKey, "EMPTY": ""}
	for k, v := range extra {
		secrets[k] = v
	}
	return &runnerv1.Task{Id: testTaskID, Context: ctx, Secrets: secrets}
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testOptions: no timer fires unless a test asks for it; retries are quick.
func testOptions(logs io.Writer, mod func(*Options)) Options {
	l := logrus.New()
	l.SetOutput(logs)
	o := Options{
		LogInterval: time.Hour, StateInterval: time.Hour, FirstRowDelay: time.Hour, MaxBufferedRows: 1000,
		CallTimeout: time.Second, RetryDelay: time.Millisecond, CloseTimeout: 2 * time.Second,
		Logger: l,
	}
	if mod != nil {
		mod(&o)
	}
	return o
}

type harness struct {
	fake *fakeGitea
	r    *Reporter
	act  *actLog
	logs *syncBuffer
}

func newHarness(t *testing.T, steps int, extraSecrets map[string]string, mod func(*Options)) *harness {
	t.Helper()
	h := &harness{fake: newFake(testTaskID, steps), logs: &syncBuffer{}}
	h.r = New(context.Background(), h.fake, testTask(extraSecrets), steps, testOptions(h.logs, mod))
	h.act = newActLog(h.r)
	t.Cleanup(func() { _ = h.r.Close("") })
	return h
}

// waitFor polls cond for up to 3s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func results(steps []*runnerv1.StepState) []runnerv1.Result {
	out := make([]runnerv1.Result, len(steps))
	for i, s := range steps {
		out[i] = s.GetResult()
	}
	return out
}
