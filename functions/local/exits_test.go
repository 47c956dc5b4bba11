package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/process"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// fakeGitea is Gitea's side of one task: whether it is over, what was
// reported.
type fakeGitea struct {
	mu       sync.Mutex
	over     bool
	reported []executor.Phase
}

func (g *fakeGitea) Terminal(context.Context, int64) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.over, nil
}

func (g *fakeGitea) Report(_ context.Context, _ int64, e executor.Executor) error {
	p := e.Phase
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reported = append(g.reported, p)
	g.over = true
	return nil
}

func (g *fakeGitea) reports() []executor.Phase {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]executor.Phase(nil), g.reported...)
}

// TestEndedExecutorIsFinishedAtOnce runs local mode's finish path (the
// process backend's OnExit -> exits -> Recoverer.Finish -> a dispatch kick)
// with a fake runner that ends at once: the task is reported as recover
// would, its executor and payload are gone and a dispatch round is asked for
// well within recover's interval, and recover's Run never runs.
func TestEndedExecutorIsFinishedAtOnce(t *testing.T) {
	const bound = 5 * time.Second // recover's default interval is 30s
	for _, tc := range []struct {
		name     string
		runner   string // the fake runner's last line
		over     bool   // Gitea knows the task is over (the runner reported it)
		reported []executor.Phase
	}{
		{"the runner reported its result", `printf 0 > "$GDR_STATUS_FILE"`, true, nil},
		{"ended with status 0, Gitea not told", `printf 0 > "$GDR_STATUS_FILE"`, false, []executor.Phase{executor.PhaseSucceeded}},
		{"died without a status", `exit 3`, false, []executor.Phase{executor.PhaseFailed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			l, a, g, kicks := finishFixture(t, "sleep 0.2\n"+tc.runner)
			g.over = tc.over
			done := make(chan struct{})
			go func() { defer close(done); l.exits.run(ctx) }()
			defer func() { cancel(); <-done }()

			started := time.Now()
			w := executor.Worker{Backend: l.backend, Bootstrap: l.recover.Bootstrap, Keys: l.recover.Keys}
			if ok, err := w.Accept(ctx, a); err != nil || !ok {
				t.Fatalf("Accept() = %v, %v", ok, err)
			}
			select {
			case <-kicks:
			case <-time.After(bound):
				t.Fatalf("no dispatch round asked for within %v of the executor's start", bound)
			}
			t.Logf("finished %v after the executor started", time.Since(started).Round(time.Millisecond))
			if e, err := l.backend.Find(ctx, a.ID); err != nil || e != nil {
				t.Errorf("executor after the finish = %+v, %v", e, err)
			}
			if ids, err := l.recover.Payloads.IDs(ctx); err != nil || len(ids) != 0 {
				t.Errorf("payloads after the finish = %v, %v", ids, err)
			}
			if got := g.reports(); !slices.Equal(got, tc.reported) {
				t.Errorf("reported %v, want %v", got, tc.reported)
			}
		})
	}
}

// finishFixture wires a local mode's finish path as start does, around a
// process backend whose runner is a script ending with runnerBody, and
// stores the payload of one claimed task; it returns that task's assignment,
// and the channel that hears each dispatch round the finish path asks for.
func finishFixture(t *testing.T, runnerBody string) (*local, taskassignment.Assignment, *fakeGitea, <-chan struct{}) {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString(trustDomain)
	keys, err := taskassignment.NewKeys(prefix)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "runner.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"+runnerBody+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	l := &local{log: slog.New(slog.DiscardHandler)}
	kicks := make(chan struct{}, 1)
	l.exits = newExits(l.finishOnce, func() {
		select {
		case kicks <- struct{}{}:
		default:
		}
	})
	pools := runnerpool.Pools{{Name: poolName, Backend: taskassignment.BackendProcess, Capacity: 1}}
	l.backend, err = process.New(process.Config{Dir: t.TempDir(), Runner: script, Pools: pools, Keys: keys, TrustDomain: td,
		Minter: ca, Env: []string{"PATH=" + os.Getenv("PATH")}, OnExit: l.exits.exited})
	if err != nil {
		t.Fatal(err)
	}
	boot, err := bootstrap.New([]byte(strings.Repeat("k", 32)), "https://127.0.0.1:1", spiffeid.RequireFromPath(td, bootstrap.DefaultGatewayPath))
	if err != nil {
		t.Fatal(err)
	}
	g := &fakeGitea{}
	env := jetstreamenv.NewQueue(t)
	pool := runnerpool.Pool{Name: poolName, Backend: taskassignment.BackendProcess, Capacity: 1}
	l.recover = &recoverer.Recoverer{TrustDomain: td, Keys: keys, Bootstrap: boot,
		Backends: map[taskassignment.BackendKind]executor.Backend{taskassignment.BackendProcess: l.backend},
		Pools:    map[string]recoverer.Pool{poolName: {Pool: pool, Tasks: g}},
		Queue:    env.Queue, Sender: env.Queue, Payloads: env.Payloads}
	id, err := taskidentity.New(td, "alice/repo", "build", 7)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendProcess, taskassignment.Task{ID: 7, Pool: poolName}, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Payloads.Put(context.Background(), a.ID, &runnerv1.Task{Id: 7}); err != nil {
		t.Fatal(err)
	}
	return l, a, g, kicks
}

func TestExitsFinishEachEndOnceAndNeverBlock(t *testing.T) {
	var (
		mu       sync.Mutex
		finished []string
	)
	kicks := make(chan struct{}, 10)
	x := newExits(func(_ context.Context, id string) bool {
		mu.Lock()
		defer mu.Unlock()
		finished = append(finished, id)
		return id != "local-2" // local-2's finish failed: its slot stays taken
	}, func() { kicks <- struct{}{} })
	for range 1000 { // nobody runs yet: exited must not block
		x.exited("local-1")
	}
	x.exited("local-2")
	x.exited("local-3")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); x.run(ctx) }()
	for range 2 {
		select {
		case <-kicks:
		case <-time.After(5 * time.Second):
			t.Fatal("no dispatch kick")
		}
	}
	cancel()
	<-done
	if want := []string{"local-1", "local-2", "local-3"}; !slices.Equal(finished, want) || len(kicks) != 0 {
		t.Fatalf("finished %v with %d more kicks, want %v and 2 kicks", finished, len(kicks), want)
	}
}
