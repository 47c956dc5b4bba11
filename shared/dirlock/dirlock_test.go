package dirlock

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// holderEnv makes the test binary a lock holder (TestHolderProcess): it
// locks the directory the variable names, starts a child that outlives it,
// prints the child's PID and waits to be killed.
const holderEnv = "DIRLOCK_TEST_HOLD"

func TestHolderProcess(t *testing.T) {
	dir := os.Getenv(holderEnv)
	if dir == "" {
		t.Skip("a helper process of TestLockFreedWhenItsHolderIsKilled")
	}
	if _, err := Acquire(dir); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	child := exec.Command("sleep", "120")
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // outlives this process, as an executor does
	if err := child.Start(); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(child.Process.Pid)
	time.Sleep(time.Minute)
	os.Exit(0)
}

// A holder SIGKILLed leaves its lock file behind and a child it started
// alive; the next Acquire succeeds at once all the same: the kernel freed
// the lock with the holder, and the child never held it.
func TestLockFreedWhenItsHolderIsKilled(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	holder := exec.Command(os.Args[0], "-test.run=^TestHolderProcess$")
	holder.Env = append(os.Environ(), holderEnv+"="+dir)
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	childPID, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		t.Fatalf("holder said %q (%v)", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(childPID, syscall.SIGKILL) })

	// While the holder lives: refused, naming it.
	_, err = Acquire(dir)
	var held *HeldError
	if !errors.As(err, &held) || held.Holder.PID != holder.Process.Pid {
		t.Fatalf("Acquire while held = %v, want a HeldError naming PID %d", err, holder.Process.Pid)
	}
	host, _ := os.Hostname()
	if held.Holder.Host != host || time.Since(held.Holder.Started) > time.Minute {
		t.Errorf("holder = %+v, want host %s and a start within the minute", held.Holder, host)
	}
	if want := fmt.Sprintf("is in use by process %d on %s", holder.Process.Pid, host); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}

	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
	// The fault happened: the holder is gone, its file is left, its child lives.
	if _, err := os.Stat(filepath.Join(dir, FileName)); err != nil {
		t.Fatalf("the killed holder's lock file: %v", err)
	}
	if err := syscall.Kill(childPID, 0); err != nil {
		t.Fatalf("the holder's child %d is gone: %v", childPID, err)
	}
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire right after the holder was killed: %v", err)
	}
	defer l.Release()
	var h Holder
	if data, err := os.ReadFile(filepath.Join(dir, FileName)); err != nil || json.Unmarshal(data, &h) != nil || h.PID != os.Getpid() {
		t.Fatalf("lock file after Acquire: %s (%v), want this process's PID %d", data, err, os.Getpid())
	}
}

func TestAcquire(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before prepares dir and returns what to release at the end.
		before func(t *testing.T, dir string) *Lock
		held   bool
	}{
		{"fresh directory (created)", func(*testing.T, string) *Lock { return nil }, false},
		{"held by another open file", func(t *testing.T, dir string) *Lock {
			l, err := Acquire(dir)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}, true},
		{"released", func(t *testing.T, dir string) *Lock {
			l, err := Acquire(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(); err != nil {
				t.Fatal(err)
			}
			return nil
		}, false},
		{"a stale file, nobody holding it", func(t *testing.T, dir string) *Lock {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, FileName), []byte(`{"pid":1,"host":"elsewhere-and-much-longer"}`), 0o600); err != nil {
				t.Fatal(err)
			}
			return nil
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if first := tc.before(t, dir); first != nil {
				defer first.Release()
			}
			l, err := Acquire(dir)
			var held *HeldError
			if tc.held {
				if !errors.As(err, &held) || held.Holder.PID != os.Getpid() || held.Dir != dir {
					t.Fatalf("Acquire = %v, want a HeldError naming PID %d", err, os.Getpid())
				}
				return
			}
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			defer l.Release()
			var h Holder
			data, _ := os.ReadFile(filepath.Join(dir, FileName))
			if err := json.Unmarshal(data, &h); err != nil || h.PID != os.Getpid() {
				t.Fatalf("lock file = %q (%v), want this process's PID", data, err)
			}
			if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("directory = %v (%v), want mode 0700", fi, err)
			}
		})
	}
}
