//go:build e2e

package giteaenv

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
)

const label = "gdr-test"

const workflow = `name: ci
on: [push]
jobs:
  hello:
    runs-on: ` + label + `
    steps:
      - run: echo hello
`

type delivery struct {
	event, signature string
	body             []byte
}

// TestE2EServer drives the whole chain against the real Gitea: webhook, repo, secrets and
// variables, push, job visible over REST, a runner registering and fetching the task,
// a log row read back, and a cancel through the web route.
func TestE2EServer(t *testing.T) {
	s := Start(t, Options{ChannelQueue: true})
	if !strings.HasSuffix(s.URL, "/") || s.AdminToken == "" {
		t.Fatalf("URL %q token %q", s.URL, s.AdminToken)
	}

	const hookSecret = "hook-secret"
	deliveries := make(chan delivery, 64)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		deliveries <- delivery{r.Header.Get("X-Gitea-Event"), r.Header.Get("X-Gitea-Signature"), b}
	}))
	t.Cleanup(hook.Close)
	if id := s.AddSystemWebhook(t, hook.URL, hookSecret); id <= 0 {
		t.Fatalf("webhook id %d", id)
	}

	repo := s.CreateRepo(t, "demo")
	if repo != s.AdminUser+"/demo" {
		t.Fatalf("repo %q", repo)
	}
	s.SetSecret(t, repo, "MY_SECRET", "s3cr3t")
	s.SetSecret(t, repo, "MY_SECRET", "s3cr3t-2") // replace
	s.SetVariable(t, repo, "MY_VAR", "v1")
	s.SetVariable(t, repo, "MY_VAR", "v2") // replace
	regToken := s.RegistrationToken(t)

	pushed := time.Now()
	sha := s.PushWorkflow(t, repo, ".gitea/workflows/ci.yml", workflow)
	if len(sha) != 40 {
		t.Fatalf("commit sha %q", sha)
	}
	job := s.WaitJob(t, repo, func(j Job) bool { return j.Status == "queued" }, 10*time.Second)
	t.Logf("job visible over REST %v after the push: %+v", time.Since(pushed).Round(time.Millisecond), job)
	if job.Name != "hello" || !slices.Equal(job.Labels, []string{label}) || job.HeadSHA != sha || job.RunID == 0 {
		t.Fatalf("job %+v", job)
	}

	// The webhook: a signed workflow_job delivery for this job.
	select {
	case d := <-deliveries:
		if d.event != "workflow_job" {
			t.Fatalf("X-Gitea-Event %q", d.event)
		}
		mac := hmac.New(sha256.New, []byte(hookSecret))
		mac.Write(d.body)
		if want := hex.EncodeToString(mac.Sum(nil)); d.signature != want {
			t.Fatalf("X-Gitea-Signature %q, want %q", d.signature, want)
		}
		var p struct {
			Action      string `json:"action"`
			WorkflowJob struct {
				ID     int64    `json:"id"`
				Labels []string `json:"labels"`
			} `json:"workflow_job"`
		}
		if err := json.Unmarshal(d.body, &p); err != nil {
			t.Fatal(err)
		}
		t.Logf("webhook %v after the push: action=%s job=%d labels=%v",
			time.Since(pushed).Round(time.Millisecond), p.Action, p.WorkflowJob.ID, p.WorkflowJob.Labels)
		if p.WorkflowJob.ID != job.ID || !slices.Equal(p.WorkflowJob.Labels, []string{label}) {
			t.Fatalf("webhook payload %s", d.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook delivery within 10s")
	}

	// A runner: Register, Declare, FetchTask.
	ctx := context.Background()
	rc := runnerv1connect.NewRunnerServiceClient(http.DefaultClient, s.URL+"api/actions")
	reg, err := rc.Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{
		Name: "giteaenv", Token: regToken, Version: "giteaenv", Labels: []string{label},
	}))
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	runner := reg.Msg.GetRunner()
	auth := func(r connect.AnyRequest) {
		r.Header().Set("x-runner-uuid", runner.GetUuid())
		r.Header().Set("x-runner-token", runner.GetToken())
	}
	dreq := connect.NewRequest(&runnerv1.DeclareRequest{Version: "giteaenv", Labels: []string{label}})
	auth(dreq)
	if _, err := rc.Declare(ctx, dreq); err != nil {
		t.Fatalf("Declare: %v", err)
	}
	var task *runnerv1.Task
	for deadline := time.Now().Add(10 * time.Second); task == nil; {
		freq := connect.NewRequest(&runnerv1.FetchTaskRequest{TasksVersion: 0})
		auth(freq)
		resp, err := rc.FetchTask(ctx, freq)
		if err != nil {
			t.Fatalf("FetchTask: %v", err)
		}
		if task = resp.Msg.GetTask(); task == nil {
			if time.Now().After(deadline) {
				t.Fatal("FetchTask returned no task within 10s")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	c := task.GetContext().AsMap()
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	skeys := make([]string, 0, len(task.GetSecrets()))
	for k := range task.GetSecrets() {
		skeys = append(skeys, k)
	}
	slices.Sort(skeys)
	t.Logf("task id=%d context keys=%v secrets=%v vars=%v", task.GetId(), keys, skeys, task.GetVars())
	t.Logf("context: repository=%v job=%v run_id=%v(%T) server_url=%v sha=%v event_name=%v",
		c["repository"], c["job"], c["run_id"], c["run_id"], c["server_url"], c["sha"], c["event_name"])
	t.Logf("workflow_payload:\n%s", task.GetWorkflowPayload())
	if c["repository"] != repo || c["job"] != "hello" || c["sha"] != sha || c["server_url"] != s.URL {
		t.Fatalf("task context %v", c)
	}
	if sec := task.GetSecrets(); sec["MY_SECRET"] != "s3cr3t-2" || sec["GITEA_TOKEN"] == "" {
		t.Fatalf("task secrets keys %v", skeys)
	}
	if task.GetVars()["MY_VAR"] != "v2" {
		t.Fatalf("task vars %v", task.GetVars())
	}
	claimed := s.WaitJob(t, repo, func(j Job) bool { return j.ID == job.ID && j.Status == "in_progress" }, 5*time.Second)
	if claimed.RunnerID != runner.GetId() || claimed.RunnerName != "giteaenv" {
		t.Fatalf("claimed job %+v, runner id %d", claimed, runner.GetId())
	}

	// A log row, read back over REST.
	lreq := connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: task.GetId(), Index: 0,
		Rows: []*runnerv1.LogRow{{Content: "hello from giteaenv"}}})
	auth(lreq)
	if _, err := rc.UpdateLog(ctx, lreq); err != nil {
		t.Fatalf("UpdateLog: %v", err)
	}
	if logs := s.JobLogs(t, repo, job.ID); !strings.Contains(logs, "hello from giteaenv") {
		t.Fatalf("job logs %q", logs)
	}

	// Cancel (the runner did not declare "cancelling": cancelled at once).
	s.CancelRun(t, repo, job.RunID)
	done := s.WaitJob(t, repo, func(j Job) bool { return j.ID == job.ID && j.Status == "completed" }, 5*time.Second)
	if done.Conclusion != "cancelled" {
		t.Fatalf("after cancel: %+v", done)
	}
	ureq := connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: task.GetId()}})
	auth(ureq)
	ures, err := rc.UpdateTask(ctx, ureq)
	if err != nil {
		t.Fatalf("UpdateTask: %v", err)
	}
	if got := ures.Msg.GetState().GetResult(); got != runnerv1.Result_RESULT_CANCELLED {
		t.Fatalf("heartbeat after cancel answers %v", got)
	}
}

// TestRestart: data, tokens and port survive Stop/Restart; the default (durable) queue
// still turns a push into a job; PushWorkflow updates an existing file.
func TestE2ERestart(t *testing.T) {
	s := Start(t, Options{ZombieTaskTimeout: time.Minute, ZombieSchedule: "@every 1m"})
	repo := s.CreateRepo(t, "keep")
	s.PushWorkflow(t, repo, ".gitea/workflows/ci.yml", workflow)
	first := s.WaitJob(t, repo, func(j Job) bool { return j.Status == "queued" }, 10*time.Second)

	s.Stop(t)
	if _, err := http.Get(s.URL + "api/healthz"); err == nil {
		t.Fatal("healthz answers while stopped")
	}
	s.Restart(t)

	s.PushWorkflow(t, repo, ".gitea/workflows/ci.yml", strings.Replace(workflow, "hello", "again", 1))
	second := s.WaitJob(t, repo, func(j Job) bool { return j.Name == "again" }, 10*time.Second)
	if second.RunID == first.RunID {
		t.Fatalf("same run: %+v %+v", first, second)
	}
	if jobs := s.Jobs(t, repo); len(jobs) != 2 || jobs[0].ID != first.ID {
		t.Fatalf("jobs after restart %+v", jobs)
	}
	s.CancelRun(t, repo, first.RunID) // logs in after the restart
	s.WaitJob(t, repo, func(j Job) bool { return j.ID == first.ID && j.Conclusion == "cancelled" }, 5*time.Second)
}
