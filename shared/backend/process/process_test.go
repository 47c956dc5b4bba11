package process

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
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

func setup(t *testing.T, body string) (*Backend, taskassignment.Assignment, executor.LaunchSpec) {
	t.Helper()
	keys, _ := taskassignment.NewKeys("ci.example.org")
	ca, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Dir: t.TempDir(), Runner: fakeRunner(t, body), Keys: keys, TrustDomain: td, Minter: ca, Env: []string{"PATH=" + os.Getenv("PATH")}})
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
		return Config{Dir: t.TempDir(), Runner: "runner", Keys: keys, TrustDomain: td, Minter: ca}
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
