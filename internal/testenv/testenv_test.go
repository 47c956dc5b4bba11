package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fakeTB records how RequirePeer ends a test without ending the real one.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Skip(args ...any) {
	f.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatal(args ...any) {
	f.failed = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatalf(format string, a ...any) {
	f.failed = fmt.Sprintf(format, a...)
	runtime.Goexit()
}

// requireOutcome runs RequirePeer on its own goroutine (Skip/Fatal end it with Goexit).
func requireOutcome(p Peer) (dir, skipped, failed string) {
	var f fakeTB
	done := make(chan struct{})
	go func() { defer close(done); dir = RequirePeer(&f, p) }()
	<-done
	return dir, f.skipped, f.failed
}

var peer = Peer{Name: "demo", Version: "v1.2.3", Executables: []string{"demo"}, Folders: []string{"static/options"}}

// TestRequirePeerMissing: a missing peer skips a developer's test but fails under CI=true.
func TestRequirePeerMissing(t *testing.T) {
	t.Setenv("GDR_DEMO_DIR", "")
	t.Setenv("GDR_PEERS", t.TempDir())
	t.Setenv("CI", "")
	if _, skipped, failed := requireOutcome(peer); !strings.Contains(skipped, "make peers") || failed != "" {
		t.Fatalf("without CI: skipped=%q failed=%q", skipped, failed)
	}
	t.Setenv("CI", "true")
	if _, skipped, failed := requireOutcome(peer); !strings.Contains(failed, "make peers") || skipped != "" {
		t.Fatalf("with CI=true: skipped=%q failed=%q", skipped, failed)
	}
}

// TestRequirePeerFolder: a build is found in the cache only with its stamp and every file it
// must hold; the override folder needs no stamp.
func TestRequirePeerFolder(t *testing.T) {
	t.Setenv("CI", "true")
	t.Setenv("GDR_DEMO_DIR", "")
	root := t.TempDir()
	t.Setenv("GDR_PEERS", root)
	dir := filepath.Join(root, "demo-v1.2.3")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "static", "options"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "demo"), []byte("#!/bin/sh\n"), 0o755))
	if _, _, failed := requireOutcome(peer); !strings.Contains(failed, "not a complete build") {
		t.Fatalf("without the stamp: failed=%q", failed)
	}
	must(os.WriteFile(filepath.Join(dir, ".complete"), nil, 0o644))
	if got, skipped, failed := requireOutcome(peer); got != dir || skipped != "" || failed != "" {
		t.Fatalf("complete build: dir=%q skipped=%q failed=%q", got, skipped, failed)
	}
	must(os.Chmod(filepath.Join(dir, "demo"), 0o644))
	if _, _, failed := requireOutcome(peer); !strings.Contains(failed, "not an executable file") {
		t.Fatalf("with a non-executable binary: failed=%q", failed)
	}
	must(os.Chmod(filepath.Join(dir, "demo"), 0o755))
	must(os.RemoveAll(filepath.Join(dir, "static")))
	if _, _, failed := requireOutcome(peer); !strings.Contains(failed, "not a folder") {
		t.Fatalf("without static/options: failed=%q", failed)
	}

	other := t.TempDir()
	must(os.MkdirAll(filepath.Join(other, "static", "options"), 0o755))
	must(os.WriteFile(filepath.Join(other, "demo"), []byte("#!/bin/sh\n"), 0o755))
	t.Setenv("GDR_DEMO_DIR", other)
	if got, skipped, failed := requireOutcome(peer); got != other || skipped != "" || failed != "" {
		t.Fatalf("GDR_DEMO_DIR: dir=%q skipped=%q failed=%q", got, skipped, failed)
	}
}

// TestProcessStopEndsGroup: Stop ends the process and the children it started.
func TestProcessStopEndsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child")
	p, err := StartProcess(exec.Command("/bin/sh", "-c", `sleep 60 & echo $! >"$0"; wait`, pidFile))
	if err != nil {
		t.Fatal(err)
	}
	var child int
	for deadline := time.Now().Add(10 * time.Second); child == 0; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(pidFile)
		if _, err := fmt.Sscan(string(b), &child); err != nil && time.Now().After(deadline) {
			t.Fatalf("no child pid: %v", err)
		}
	}
	p.Stop(5 * time.Second)
	select {
	case <-p.Exited():
	default:
		t.Fatal("Stop returned before the process exited")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child)); err != nil || strings.Contains(string(b), ") Z ") {
			break // gone, or a zombie waiting for init
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d of the group still runs after Stop", child)
		}
	}
	p.Stop(5 * time.Second) // a second Stop returns at once
}

// TestProcessWaitReady: WaitReady reports readiness, an exit before it, and a deadline.
func TestProcessWaitReady(t *testing.T) {
	p, err := StartProcess(exec.Command("/bin/sh", "-c", "sleep 60"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(5 * time.Second)
	calls := 0
	if err := p.WaitReady(context.Background(), time.Millisecond, func(context.Context) error {
		if calls++; calls < 3 {
			return fmt.Errorf("not yet")
		}
		return nil
	}); err != nil || calls != 3 {
		t.Fatalf("WaitReady = %v after %d calls, want nil after 3", err, calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.WaitReady(ctx, time.Millisecond, func(context.Context) error { return fmt.Errorf("never") }); err == nil ||
		!strings.Contains(err.Error(), "never") {
		t.Fatalf("WaitReady past its deadline = %v", err)
	}

	q, err := StartProcess(exec.Command("/bin/sh", "-c", "exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Stop(5 * time.Second)
	if err := q.WaitReady(context.Background(), time.Millisecond, func(context.Context) error { return fmt.Errorf("down") }); err == nil ||
		!strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitReady on an exited process = %v", err)
	}
}
