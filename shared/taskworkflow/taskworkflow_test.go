package taskworkflow

import (
	"reflect"
	"strings"
	"testing"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

func TestJobImage(t *testing.T) {
	for _, tc := range []struct {
		payload, want, wantErr string
	}{
		{"jobs:\n  b:\n    runs-on: x\n", "", ""},
		{"jobs:\n  b:\n    container: alpine:3\n", "alpine:3", ""},
		{"jobs:\n  b:\n    container:\n      image: ghcr.io/o/i@sha256:00\n      options: --cpus 1\n", "ghcr.io/o/i@sha256:00", ""},
		{"jobs:\n  b:\n    container:\n      options: x\n", "", "no image"},
		{"jobs:\n  b:\n    container: [a]\n", "", "want an image"},
		{"jobs: {}\n", "", "0 jobs"},
		{"jobs: [\n", "", "not YAML"},
	} {
		got, err := JobImage([]byte(tc.payload))
		if got != tc.want || (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("JobImage(%q) = %q, %v; want %q, error %q", tc.payload, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestFromTaskCarriesServices(t *testing.T) {
	task := &runnerv1.Task{Id: 42, WorkflowPayload: []byte("on: push\njobs:\n  build:\n    runs-on: x\n    container: golang:1.26\n" +
		"    services:\n      redis:\n        image: redis:7\n        ports: ['6379']\n      db:\n        image: postgres:17\n" +
		"        env: {POSTGRES_PASSWORD: postgres}\n    steps:\n      - run: true\n")}
	task.Context, _ = structpb.NewStruct(map[string]any{"repository": "alice/repo", "job": "build"})
	a, err := FromTask(td, taskassignment.BackendPod, "linux", task)
	if err != nil {
		t.Fatal(err)
	}
	want := []jobservices.Service{
		{ID: "db", Image: "postgres:17", Env: map[string]string{"POSTGRES_PASSWORD": "postgres"}},
		{ID: "redis", Image: "redis:7", Ports: []string{"6379"}},
	}
	if a.Task.Image != "golang:1.26" || !reflect.DeepEqual(a.Task.Services, want) {
		t.Fatalf("FromTask: image %q, services %+v", a.Task.Image, a.Task.Services)
	}
	task.WorkflowPayload = []byte("on: push\njobs:\n  build:\n    runs-on: x\n    services:\n      db:\n        ports: ['1']\n")
	if _, err := FromTask(td, taskassignment.BackendPod, "linux", task); err == nil || !strings.Contains(err.Error(), `service "db": no image`) {
		t.Fatalf("a service without an image: %v", err)
	}
}

const twoServices = `on: push
jobs:
  test:
    runs-on: ubuntu-latest
    services:
      redis:
        image: redis:7
        ports: ["6379"]
      postgres:
        image: postgres:17
        env:
          POSTGRES_PASSWORD: postgres
        ports: ["5432:5432"]
        options: --health-cmd "pg_isready -U postgres" --health-interval 2s
        credentials:
          username: u
          password: ${{ secrets.REGISTRY_PASSWORD }}
        cmd: [postgres, -c, fsync=off]
    steps:
      - run: true
`

func TestFromWorkflow(t *testing.T) {
	got, err := FromWorkflow([]byte(twoServices))
	if err != nil {
		t.Fatal(err)
	}
	want := []jobservices.Service{
		{ID: "postgres", Image: "postgres:17", Env: map[string]string{"POSTGRES_PASSWORD": "postgres"}, Ports: []string{"5432:5432"},
			Cmd: []string{"postgres", "-c", "fsync=off"}, Options: `--health-cmd "pg_isready -U postgres" --health-interval 2s`, Credentials: true},
		{ID: "redis", Image: "redis:7", Ports: []string{"6379"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("FromWorkflow =\n%+v\nwant\n%+v", got, want)
	}
	if ids := jobservices.IDs(got); !reflect.DeepEqual(ids, []string{"postgres", "redis"}) {
		t.Fatalf("IDs = %v", ids)
	}

	none, err := FromWorkflow([]byte("on: push\njobs:\n  a:\n    runs-on: x\n    steps:\n      - run: true\n"))
	if err != nil || none != nil {
		t.Fatalf("no services: %v, %v", none, err)
	}
	for name, wf := range map[string]string{
		"no image":  "on: push\njobs:\n  a:\n    runs-on: x\n    services:\n      db:\n        ports: [1]\n",
		"two jobs":  "on: push\njobs:\n  a:\n    runs-on: x\n  b:\n    runs-on: x\n",
		"not YAML":  "jobs: [",
		"empty one": "on: push\njobs:\n  a:\n    runs-on: x\n    services:\n      db:\n",
	} {
		if _, err := FromWorkflow([]byte(wf)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
