package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// giteaAnswers is a registration that answers what it is told to: the
// events' unit tests need Gitea's answers, not Gitea (the e2e test has it).
type giteaAnswers struct {
	task   *runnerv1.Task
	result runnerv1.Result // what UpdateTask answers
	err    error
}

func (g *giteaAnswers) Declare(context.Context, []string) error { return nil }
func (g *giteaAnswers) FetchTask(context.Context) (*runnerv1.Task, error) {
	return g.task, g.err
}
func (g *giteaAnswers) UpdateTask(_ context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	if g.err != nil {
		return nil, g.err
	}
	return &runnerv1.UpdateTaskResponse{State: &runnerv1.TaskState{Id: req.GetState().GetId(), Result: g.result}}, nil
}
func (g *giteaAnswers) UpdateLog(context.Context, *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	return &runnerv1.UpdateLogResponse{}, nil
}

const secretValue = "s3cr3t-value"

func taskFor(t *testing.T, id int64) *runnerv1.Task {
	t.Helper()
	ctx, err := structpb.NewStruct(map[string]any{
		"server_url": "http://gitea.test:3000/", "repository": "alice/demo", "run_id": "42", "job": "build",
		"token": secretValue, "gitea_runtime_token": secretValue,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &runnerv1.Task{Id: id, Context: ctx, Secrets: map[string]string{"DEPLOY": secretValue}, WorkflowPayload: []byte("secret: " + secretValue)}
}

// lines decodes the JSON log lines written to out.
func lines(t *testing.T, out *bytes.Buffer) []map[string]any {
	t.Helper()
	var got []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", l, err)
		}
		got = append(got, m)
	}
	return got
}

func TestJobEventsOneLinePerEvent(t *testing.T) {
	const url = "http://gitea.test:3000/alice/demo/actions/runs/42"
	for _, tc := range []struct {
		name string
		// finish reports the task's end to Gitea through w.
		finish     func(w watched, g *giteaAnswers)
		wantResult string
	}{
		{"the runner reports success", func(w watched, g *giteaAnswers) {
			_, _ = w.UpdateTask(context.Background(), &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 7, Result: runnerv1.Result_RESULT_SUCCESS}})
		}, "success"},
		{"Gitea answers cancelled to a heartbeat", func(w watched, g *giteaAnswers) {
			g.result = runnerv1.Result_RESULT_CANCELLED
			_, _ = w.UpdateTask(context.Background(), &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 7}})
		}, "cancelled"},
		{"recover fails the job", func(w watched, g *giteaAnswers) {
			_, _ = w.UpdateTask(context.Background(), &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 7, Result: runnerv1.Result_RESULT_FAILURE}})
		}, "failure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			e := newJobEvents(slog.New(slog.NewJSONHandler(&out, nil)))
			now := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
			e.now = func() time.Time { return now }
			g := &giteaAnswers{task: taskFor(t, 7)}
			w := watched{registration: g, events: e}
			if task, err := w.FetchTask(context.Background()); err != nil || task.GetId() != 7 {
				t.Fatalf("FetchTask = %v, %v", task, err)
			}
			e.running(7, "local-7")
			e.running(7, "local-7") // a redelivery: said once
			// A heartbeat while it runs says nothing.
			if _, err := w.UpdateTask(context.Background(), &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 7}}); err != nil {
				t.Fatal(err)
			}
			now = now.Add(83 * time.Second)
			tc.finish(w, g)
			tc.finish(w, g) // Gitea keeps answering the result: said once
			got := lines(t, &out)
			if len(got) != 3 {
				t.Fatalf("want 3 lines:\n%s", out.String())
			}
			want := []map[string]any{
				{"msg": msgPickedUp, "task": 7.0, "job": "build", "repository": "alice/demo", "url": url},
				{"msg": msgRunning, "task": 7.0, "job": "build", "executor": "local-7"},
				{"msg": msgFinished, "task": 7.0, "job": "build", "result": tc.wantResult, "url": url, "duration": "1m23s"},
			}
			for i, w := range want {
				for k, v := range w {
					if got[i][k] != v {
						t.Errorf("line %d: %s = %v, want %v", i, k, got[i][k], v)
					}
				}
			}
			if strings.Contains(out.String(), secretValue) {
				t.Errorf("a line shows a secret:\n%s", out.String())
			}
		})
	}
}

func TestJobEventsFault(t *testing.T) {
	var out bytes.Buffer
	e := newJobEvents(slog.New(slog.NewJSONHandler(&out, nil)))
	g := &giteaAnswers{err: errors.New("Gitea unreachable")}
	w := watched{registration: g, events: e}
	if _, err := w.FetchTask(context.Background()); err == nil {
		t.Fatal("FetchTask hid Gitea's error")
	}
	if _, err := w.UpdateTask(context.Background(), &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 9, Result: runnerv1.Result_RESULT_SUCCESS}}); err == nil {
		t.Fatal("UpdateTask hid Gitea's error")
	}
	if out.Len() != 0 {
		t.Fatalf("a refused claim or report is no event:\n%s", out.String())
	}
	// No task claimed: FetchTask's nil task is no event either.
	g.err = nil
	if _, err := w.FetchTask(context.Background()); err != nil || out.Len() != 0 {
		t.Fatalf("no task: %v\n%s", err, out.String())
	}
	// A task picked up before a restart still ends with its result.
	if _, err := w.UpdateTask(context.Background(), &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 9, Result: runnerv1.Result_RESULT_FAILURE}}); err != nil {
		t.Fatal(err)
	}
	got := lines(t, &out)
	if len(got) != 1 || got[0]["msg"] != msgFinished || got[0]["task"] != 9.0 || got[0]["result"] != "failure" {
		t.Fatalf("lines = %v", got)
	}
}

func TestJobEventsTextLine(t *testing.T) {
	var out bytes.Buffer
	e := newJobEvents(slog.New(slog.NewTextHandler(&out, nil)))
	e.pickedUp(taskFor(t, 3))
	line := strings.TrimSpace(out.String())
	for _, want := range []string{`msg="job picked up"`, "task=3", "job=build", "repository=alice/demo", "url=http://gitea.test:3000/alice/demo/actions/runs/42"} {
		if !strings.Contains(line, want) {
			t.Errorf("line lacks %q: %s", want, line)
		}
	}
	if strings.Contains(line, secretValue) || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("line = %q", out.String())
	}
}

// A task an earlier local mode picked up (resumed from its stored payload at
// the start) is said finished with its job, URL and the time since its
// claim, and nothing is said of it before.
func TestJobEventsResumedAfterARestart(t *testing.T) {
	var out bytes.Buffer
	e := newJobEvents(slog.New(slog.NewJSONHandler(&out, nil)))
	claimed := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	e.now = func() time.Time { return claimed.Add(90 * time.Second) }
	e.resume(taskFor(t, 4), claimed)
	if out.Len() != 0 {
		t.Fatalf("resume said something:\n%s", out.String())
	}
	e.finished(4, runnerv1.Result_RESULT_SUCCESS)
	got := lines(t, &out)
	want := map[string]any{"msg": msgFinished, "task": 4.0, "job": "build", "result": "success",
		"url": "http://gitea.test:3000/alice/demo/actions/runs/42", "duration": "1m30s"}
	if len(got) != 1 {
		t.Fatalf("lines = %v", got)
	}
	for k, v := range want {
		if got[0][k] != v {
			t.Errorf("%s = %v, want %v", k, got[0][k], v)
		}
	}
}
