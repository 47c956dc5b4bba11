package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a peer running as a child of the test binary, in a process
// group of its own so that Stop ends whatever it started too. On Linux the
// kernel also kills it (SIGKILL) if the test binary dies first, so a crashed
// or killed test leaves no peer behind.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	stop   sync.Once
}

// StartProcess starts cmd, which must not have been started, setting its
// SysProcAttr. The caller sets everything else (Dir, Env, Stdout, Stderr) and
// must Stop the process.
//
// cmd is started and waited for on one locked OS thread, kept for the life of
// the process: the parent-death signal follows the thread that forked the
// child, not the process.
func StartProcess(cmd *exec.Cmd) (*Process, error) {
	cmd.SysProcAttr = sysProcAttr()
	p := &Process{cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	return p, nil
}

// PID is the process's ID (for a measurement of its own: /proc/<pid>/stat).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited and been waited for.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// WaitReady calls ready every interval until it returns nil, and then returns
// nil. It returns an error if the process exits first, or if ctx ends first
// (wrapping ready's last error).
func (p *Process) WaitReady(ctx context.Context, interval time.Duration, ready func(context.Context) error) error {
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return errors.New("the process exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last answer: %w)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// Stop ends the process and its group: SIGTERM to the group, SIGKILL once
// grace has passed without the process exiting, then SIGKILL to whatever is
// left of the group. It returns once the process has exited; calling it again
// (or concurrently) waits for the same.
func (p *Process) Stop(grace time.Duration) {
	p.stop.Do(func() {
		pgid := p.cmd.Process.Pid // Setpgid: the group id is the leader's pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.exited
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // leftover children of the group, if any
	})
}

// FreePort returns a TCP port of 127.0.0.1 that was free a moment ago. Another
// process may take it before the caller binds it: a peer that fails to bind
// should be started again on another port.
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := FreePorts(1)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return ports[0]
}

// FreePorts returns n distinct TCP ports of 127.0.0.1 that were free a moment
// ago (see FreePort), for a harness that picks its ports outside a test. It
// holds all n open until it has them, so no two are the same.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// LogTail returns the last n lines of the file at path (a peer's log), or the
// error reading it.
func LogTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
