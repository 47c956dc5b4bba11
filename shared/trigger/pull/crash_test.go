package pull

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor/executortest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// The crash child: a handle process whose backend stops dead right after
// Create, before Accept returns and long before the ack.
const (
	envCrashChild = "INTAKE_CRASH_CHILD_NATS_URL"
	envCrashDir   = "INTAKE_CRASH_CHILD_DIR"
)

func TestMain(m *testing.M) {
	if url := os.Getenv(envCrashChild); url != "" {
		os.Exit(crashChild(url, os.Getenv(envCrashDir)))
	}
	os.Exit(m.Run())
}

func crashChild(url, dir string) int {
	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c, err := assignmentqueue.New(js, "").Consumer(context.Background(), taskassignment.BackendProcess)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	backend := executortest.Files{Dir: dir, Target: "node-1", AfterCreate: func(string) {
		_ = os.WriteFile(filepath.Join(dir, "created"), nil, 0o600)
		select {} // wait for SIGKILL
	}}
	_, err = job(c, handlertest.Worker(nopT{}, backend), nil).Run(context.Background())
	fmt.Fprintln(os.Stderr, "crash child returned:", err)
	return 3
}

// nopT lets the test fixtures run in the child process, outside a test.
type nopT struct{ testing.TB }

func (nopT) Helper()               {}
func (nopT) Fatal(args ...any)     { panic(fmt.Sprint(args...)) }
func (nopT) Fatalf(string, ...any) { panic("fixture failed") }

func TestKilledAfterCreateBeforeAck(t *testing.T) {
	env := jetstreamenv.NewQueue(t)
	url, js, q := env.URL, env.JetStream, env.Queue
	ctx := context.Background()
	// The production consumer, but with a short AckWait so that the lost
	// delivery comes back within the test.
	c := shortAckWait(t, js, time.Second)
	a := handlertest.Assignment(t, 77)
	publish(t, q, a)

	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), envCrashChild+"="+url, envCrashDir+"="+dir)
	var stderr strings.Builder
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "created")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = child.Process.Kill()
			t.Fatalf("the child never created the executor; stderr:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()

	backend := executortest.Files{Dir: dir, Target: "node-1"}
	if e, err := backend.Find(ctx, a.ID); err != nil || e == nil {
		t.Fatalf("the killed child left no executor: %v", err)
	}
	expectOutstanding(t, q, 1)

	var events []executor.EventName
	w := handlertest.Worker(t, backend)
	w.OnEvent = func(e executor.Event) { events = append(events, e.Name) }
	j := job(c, w, nil)
	j.Wait = 5 * time.Second
	sum, err := j.Run(ctx)
	if err != nil || sum.Accepted != 1 {
		t.Fatalf("the redelivered message was not accepted: %+v, %v", sum, err)
	}
	if len(events) == 0 || events[0] != executor.EventExecutorFound {
		t.Fatalf("events = %v, want the executor found", events)
	}
	creates, err := os.ReadFile(filepath.Join(dir, "creates.log"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(creates)); len(got) != 1 || got[0] != a.ID {
		t.Fatalf("creates = %q, want exactly one for %s", got, a.ID)
	}
	expectOutstanding(t, q, 0)
}
