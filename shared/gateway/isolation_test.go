package gateway

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
)

// A forged assignment can make handle start an executor whose SVID and
// capability are valid, for repository B and with repository A's task ID.
// The gateway must still refuse it everything of task A: the payload's own
// repository decides, not the caller's claim.
func TestAnotherRepositoryWithThisTaskIDIsForbidden(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	forged := spiffeid.RequireFromPath(td, "/repo/mallory/repo/task/7")
	svid, err := f.ca.Mint(forged, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	capability := f.boot.Capability("linux-7", 7, forged.String()) // what handle computes for the forged assignment
	c := NewClient(f.url, Credentials{SVID: svid, Bundle: f.ca, AssignmentID: "linux-7", Capability: capability}, tlsconfig.AuthorizeMemberOf(td))

	if _, err := c.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{})); code(err) != connect.CodePermissionDenied {
		t.Errorf("FetchTask: %v, want permission denied", err)
	}
	if _, err := c.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 7}})); code(err) != connect.CodePermissionDenied {
		t.Errorf("UpdateTask: %v, want permission denied", err)
	}
	if _, err := c.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 7})); code(err) != connect.CodePermissionDenied {
		t.Errorf("UpdateLog: %v, want permission denied", err)
	}
	f.gitea.mu.Lock()
	defer f.gitea.mu.Unlock()
	if len(f.gitea.tasks) != 0 || len(f.gitea.logs) != 0 {
		t.Errorf("reached Gitea: tasks %v, logs %v", f.gitea.tasks, f.gitea.logs)
	}
	if started, err := f.payloads.Started(ctx, "linux-7"); err != nil || started {
		t.Errorf("started mark of task 7: %v, %v; the forged executor must not set it", started, err)
	}
	// The real executor of task 7 is still served.
	if _, err := f.own(t, 7).FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{})); err != nil {
		t.Errorf("the task's own executor: %v", err)
	}
}

// countingBody counts what the transport takes of a request body.
type countingBody struct {
	left int64
	read atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	n := int64(len(p))
	if n > b.left {
		n = b.left
	}
	clear(p[:n])
	b.left -= n
	b.read.Add(n)
	return int(n), nil
}

// A 64 MiB UpdateLog with a forged capability is refused from its headers:
// the gateway does not read the body, so the client cannot send it whole.
func TestLargeUnauthenticatedBodyIsNotRead(t *testing.T) {
	f := start(t)
	svid, err := f.ca.Mint(taskID(7), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	body := &countingBody{left: 64 << 20}
	tlsConf := tlsconfig.MTLSClientConfig(svid, f.ca, tlsconfig.AuthorizeMemberOf(td))
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf}, Timeout: 30 * time.Second}
	req, err := http.NewRequest(http.MethodPost, f.url+"/runner.v1.RunnerService/UpdateLog", body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 64 << 20
	req.Header.Set("Content-Type", "application/proto")
	req.Header.Set(HeaderAssignment, "linux-7")
	req.Header.Set(HeaderCapability, "forged")
	resp, err := hc.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status %d, want 401", resp.StatusCode)
		}
	}
	if n := body.read.Load(); n >= 16<<20 {
		t.Fatalf("the client sent %d bytes of a refused 64 MiB body", n)
	}
}

// An authenticated caller's body is capped at MaxRequestBytes.
func TestAuthenticatedBodyIsCapped(t *testing.T) {
	f := start(t)
	rows := make([]*runnerv1.LogRow, 0, 64)
	for range 64 {
		rows = append(rows, &runnerv1.LogRow{Content: string(make([]byte, 128<<10))})
	}
	_, err := f.own(t, 7).UpdateLog(context.Background(), connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 7, Rows: rows}))
	if code(err) != connect.CodeResourceExhausted {
		t.Fatalf("UpdateLog of 8 MiB: %v, want resource exhausted", err)
	}
}

// countingPayloads counts the payload reads of the gateway.
type countingPayloads struct {
	*assignmentqueue.Payloads
	gets atomic.Int64
}

func (c *countingPayloads) Get(ctx context.Context, assignmentID string) (*runnerv1.Task, error) {
	c.gets.Add(1)
	return c.Payloads.Get(ctx, assignmentID)
}

// A bound executor's reports, every second or so for a whole job, cost no
// payload read each; a caller that is refused is checked every time.
func TestReportsOfABoundExecutorReadNoPayload(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	own := f.own(t, 7)
	if _, err := own.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{})); err != nil {
		t.Fatal(err)
	}
	// The fetch reads the payload twice: to bind its executor, and after its started mark
	// (stillBound).
	if n := f.reads.gets.Load(); n != 2 {
		t.Fatalf("%d payload reads for one fetch, want 2", n)
	}
	for range 5 {
		if _, err := own.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 7})); err != nil {
			t.Fatal(err)
		}
		if _, err := own.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: 7}})); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.reads.gets.Load(); n != 2 {
		t.Fatalf("%d payload reads for one fetch and ten reports, want the fetch's 2", n)
	}
	forged := spiffeid.RequireFromPath(td, "/repo/mallory/repo/task/7")
	svid, err := f.ca.Mint(forged, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(f.url, Credentials{SVID: svid, Bundle: f.ca, AssignmentID: "linux-7",
		Capability: f.boot.Capability("linux-7", 7, forged.String())}, tlsconfig.AuthorizeMemberOf(td))
	for range 2 {
		if _, err := c.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{TaskId: 7})); code(err) != connect.CodePermissionDenied {
			t.Fatalf("forged UpdateLog after the real executor was bound: %v, want permission denied", err)
		}
	}
	if n := f.reads.gets.Load(); n != 4 {
		t.Fatalf("%d payload reads, want the fetch's 2 and one for each of the 2 refused calls: a refused caller is checked every time", n)
	}
}
