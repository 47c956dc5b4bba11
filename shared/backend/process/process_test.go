package process

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

// fakeRunner writes a script that behaves as the runner's end: it dumps its
// environment, then runs the body.
func fakeRunner(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runner.sh")
	script := "#!/bin/sh\nenv > \"$GDR_WORK_DIR.env\"\n" + body + "\n"
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return path
}

// testPools are a process pool, the one setup's assignment names, and a
// pod pool.
var testPools = runnerpool.Pools{
	{Name: "local", Labels: []string{"self-hosted"}, Backend: taskassignment.BackendProcess, Capacity: 2},
	{Name: "linux", Labels: []string{"ubuntu-latest"}, Backend: taskassignment.BackendPod, Capacity: 2},
}

// A signed assignment of the process backend whose pool is not a process
// pool of the installation (a pod pool, a pool it does not have) is refused
// for good and starts no process: the backend never runs a job of a pool
// that promised isolation, or of no pool at all, as a host process.
func TestCreateRefusesPoolsItDoesNotServe(t *testing.T) {
	b, a, spec := setup(t, "exit 0")
	for _, pool := range []string{"linux", "gpu", ""} {
		t.Run("pool "+pool, func(t *testing.T) {
			other := a
			other.Task.Pool = pool
			e, err := b.Create(t.Context(), other, spec)
			if !executor.IsPermanent(err) || !strings.Contains(err.Error(), `runner pool "`+pool+`" is not a process pool`) {
				t.Fatalf("Create = %+v, %v; want a permanent error naming pool %q", e, err, pool)
			}
			if found, err := b.Find(t.Context(), other.ID); err != nil || found != nil {
				t.Fatalf("after the refusal Find = %+v, %v; want no executor", found, err)
			}
		})
	}
	if e, err := b.Create(t.Context(), a, spec); err != nil || e == nil {
		t.Fatalf("Create of the process pool's assignment = %+v, %v", e, err)
	}
	// Its process ends at once; the test's directory goes once it has.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if e, err := b.Find(t.Context(), a.ID); err == nil && e != nil && e.Phase.Terminal() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process pool's executor did not end within 5 s")
		}
	}
}

func setup(t *testing.T, body string) (*Backend, taskassignment.Assignment, executor.LaunchSpec) {
	t.Helper()
	keys, _ := taskassignment.NewKeys("ci.example.org")
	ca, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Dir: t.TempDir(), Runner: fakeRunner(t, body), Pools: testPools, Keys: keys, TrustDomain: td, Minter: ca, Env: []string{"PATH=" + os.Getenv("PATH")}})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := taskidentity.New(td, "alice/repo", "build", 9)
	a, _ := taskassignment.New(taskassignment.BackendProcess, taskassignment.Task{ID: 9, Pool: "local", Image: "golang:1.26"}, id)
	boot, _ := bootstrap.New([]byte(strings.Repeat("k", 32)), "https://127.0.0.1:1", spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	env, _ := boot.Environment(a)
	env[bootstrap.EnvJobImage] = "golang:1.26"
	return b, a, executor.LaunchSpec{Metadata: keys.Metadata(a), Environment: env}
}

func waitPhase(t *testing.T, b *Backend, id string, want executor.Phase) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := b.Find(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if e != nil && e.Phase == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("executor %s: %+v, want phase %s", id, e, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want executor.Phase
	}{
		{"reported, exit 0", `printf 0 > "$GDR_STATUS_FILE"`, executor.PhaseSucceeded},
		{"could not report", `printf 1 > "$GDR_STATUS_FILE"`, executor.PhaseFailed},
		{"died without a status", `exit 0`, executor.PhaseFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, a, spec := setup(t, tc.body)
			exited := make(chan string, 1)
			b.cfg.OnExit = func(id string) { exited <- id }
			ctx := context.Background()
			if e, err := b.Find(ctx, a.ID); err != nil || e != nil {
				t.Fatalf("Find before Create = %v, %v", e, err)
			}
			e, err := b.Create(ctx, a, spec)
			if err != nil || e.IdentityTarget == "" {
				t.Fatalf("Create = %+v, %v", e, err)
			}
			select {
			case id := <-exited:
				if id != a.ID {
					t.Fatalf("OnExit(%q), want %q", id, a.ID)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("OnExit was not called")
			}
			// When OnExit hears of the end, Find already tells it.
			if e, err := b.Find(ctx, a.ID); err != nil || e.Phase != tc.want {
				t.Fatalf("Find at OnExit = %+v, %v; want phase %s", e, err, tc.want)
			}
			if err := b.BindIdentity(ctx, e, a.Identity); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestEnvironment(t *testing.T) {
	b, a, spec := setup(t, `printf 0 > "$GDR_STATUS_FILE"`)
	if _, err := b.Create(context.Background(), a, spec); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, a.ID, executor.PhaseSucceeded)
	env, err := os.ReadFile(filepath.Join(b.dir(a.ID), "work.env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{bootstrap.EnvCapability + "=", bootstrap.EnvSVIDCert + "=-----BEGIN CERTIFICATE", bootstrap.EnvAssignmentID + "=" + a.ID} {
		if !strings.Contains(string(env), want) {
			t.Errorf("the executor's environment lacks %q", want)
		}
	}
	if strings.Contains(string(env), bootstrap.EnvJobImage) {
		t.Error("a process executor was told it runs the job's image")
	}
	meta, _ := os.ReadFile(b.meta(a.ID))
	if strings.Contains(string(meta), spec.Environment[bootstrap.EnvCapability]) {
		t.Fatal("the capability is in the metadata")
	}
}

func TestCreateIsIdempotentAndDeleteKills(t *testing.T) {
	b, a, spec := setup(t, `sleep 60`)
	ctx := context.Background()
	first, err := b.Create(ctx, a, spec)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := b.read(a.ID)
	if _, err := b.Create(ctx, a, spec); err != nil {
		t.Fatal(err)
	}
	again, _ := b.read(a.ID)
	if again.PID != rec.PID {
		t.Fatalf("a second Create started another process: %d then %d", rec.PID, again.PID)
	}
	waitPhase(t, b, a.ID, executor.PhaseRunning)
	if err := b.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(rec.PID, rec.Start) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d survived Delete", rec.PID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e, err := b.Find(ctx, a.ID); err != nil || e != nil {
		t.Fatalf("Find after Delete = %v, %v", e, err)
	}
	if err := b.Delete(ctx, first); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
}

func TestRecoverAssignments(t *testing.T) {
	b, a, spec := setup(t, `printf 0 > "$GDR_STATUS_FILE"`)
	if _, err := b.Create(context.Background(), a, spec); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, a.ID, executor.PhaseSucceeded)
	if err := os.MkdirAll(b.dir("local-10"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.meta("local-10"), []byte(`{"labels":{"x":"y"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var corrupt []string
	b.cfg.OnCorrupt = func(name string, err error) { corrupt = append(corrupt, name) }
	got, err := b.RecoverAssignments(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !reflect.DeepEqual(got[0], a) || len(corrupt) != 1 || corrupt[0] != "local-10" {
		t.Fatalf("recovered %+v, corrupt %v", got, corrupt)
	}
	for _, tc := range []struct {
		id      string
		found   bool
		wantErr bool
	}{
		{a.ID, true, false}, {"local-10", false, true}, {"local-11", false, false},
	} {
		one, found, err := b.RecoverAssignment(context.Background(), tc.id)
		if found != tc.found || (err != nil) != tc.wantErr || (found && !reflect.DeepEqual(one, a)) {
			t.Errorf("RecoverAssignment(%s) = %+v, %v, %v", tc.id, one, found, err)
		}
	}
}

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	keys, _ := taskassignment.NewKeys("ci.example.org")
	ca, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	valid := func() Config {
		return Config{Dir: t.TempDir(), Runner: "runner", Pools: testPools, Keys: keys, TrustDomain: td, Minter: ca}
	}
	if _, err := New(valid()); err != nil {
		t.Fatalf("New(valid) = %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"no directory", func(c *Config) { c.Dir = "" }, "no executor directory"},
		{"no runner", func(c *Config) { c.Runner = "" }, "no runner binary"},
		{"no keys", func(c *Config) { c.Keys = taskassignment.Keys{} }, "no metadata keys"},
		{"no trust domain", func(c *Config) { c.TrustDomain = spiffeid.TrustDomain{} }, "no trust domain"},
		{"no minter", func(c *Config) { c.Minter = nil }, "no SVID minter"},
		{"negative TTL", func(c *Config) { c.SVIDTTL = -time.Second }, "negative"},
		{"no pools", func(c *Config) { c.Pools = nil }, "no runner pool uses the process backend"},
		{"only a pod pool", func(c *Config) { c.Pools = testPools[1:] }, "no runner pool uses the process backend"},
		{"directory under a file", func(c *Config) {
			f := filepath.Join(t.TempDir(), "file")
			_ = os.WriteFile(f, nil, 0o600)
			c.Dir = filepath.Join(f, "executors")
		}, "executor directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.change(&c)
			if _, err := New(c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New() error = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// TestDeleteNeverHidesAnExecutor: a Delete cut short (local mode SIGKILLed
// mid-Delete, found by make chaos-gitea) must not leave an executor's files
// without its metadata, where RecoverAssignments never sees them again: at
// every moment of a Delete, the executor's directory is either whole
// (metadata included, so the next pass deletes it again) or gone.
func TestDeleteNeverHidesAnExecutor(t *testing.T) {
	b, a, spec := setup(t, `printf 0 > "$GDR_STATUS_FILE"`)
	ctx := context.Background()
	e, err := b.Create(ctx, a, spec)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, a.ID, executor.PhaseSucceeded)
	// Files on both sides of the metadata in any directory order, and
	// enough that removing them takes a while.
	for i := range 3000 {
		if err := os.WriteFile(filepath.Join(b.dir(a.ID), fmt.Sprintf("f%04d", i)), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	hidden := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := os.Stat(b.meta(a.ID)); err == nil {
				continue
			}
			// The metadata is gone: the directory, opened after that, must
			// be gone from its name too.
			entries, err := os.ReadDir(b.dir(a.ID))
			if err != nil {
				return
			}
			if len(entries) > 0 {
				hidden <- fmt.Sprintf("%d files left without the metadata", len(entries))
			}
			return
		}
	}()
	if err := b.Delete(ctx, e); err != nil {
		t.Fatal(err)
	}
	<-done
	select {
	case h := <-hidden:
		t.Fatalf("during Delete, the executor's directory held %s: a crash then hides them from recover", h)
	default:
	}
	if entries, _ := os.ReadDir(b.cfg.Dir); len(entries) != 0 {
		t.Fatalf("left in the executor directory: %v", entries)
	}
	// What a Delete cut short after its rename leaves, the next listing
	// removes, and it is no assignment.
	cut := filepath.Join(b.cfg.Dir, deletedPrefix+a.ID)
	if err := os.MkdirAll(filepath.Join(cut, "work"), 0o700); err != nil {
		t.Fatal(err)
	}
	if got, err := b.RecoverAssignments(ctx); err != nil || len(got) != 0 {
		t.Fatalf("RecoverAssignments = %+v, %v", got, err)
	}
	if _, err := os.Stat(cut); !os.IsNotExist(err) {
		t.Fatalf("a cut Delete's files are left: %v", err)
	}
}
