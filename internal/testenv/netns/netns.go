// Package netns makes TCP sockets inside another network namespace (one a
// test harness started with unshare: a cluster's node, an OpenSandbox
// server's namespace) and forwards connections across the boundary. It
// never changes the namespace of the test process's threads that Go keeps:
// every socket is made on an OS thread that was locked, moved with setns and
// is never unlocked, so Go discards it when its goroutine ends.
//
// Linux only; setns of a network namespace needs CAP_SYS_ADMIN (root).
package netns

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Path is the network namespace file of process pid.
func Path(pid int) string { return fmt.Sprintf("/proc/%d/ns/net", pid) }

// enter locks the calling goroutine to its thread and moves that thread into
// the network namespace at nsPath. The thread must never be unlocked.
func enter(nsPath string) error {
	runtime.LockOSThread() // never unlocked: the thread leaves with its namespace
	f, err := os.Open(nsPath)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns %s: %w", nsPath, err)
	}
	return nil
}

// Listen listens on TCP address addr inside the network namespace at nsPath.
// The listening socket stays in that namespace; accepting on it works from
// any thread.
func Listen(nsPath, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		if err := enter(nsPath); err != nil {
			ch <- result{err: err}
			return
		}
		l, err := net.Listen("tcp", addr)
		ch <- result{l, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, nsPath, r.err)
	}
	return r.l, nil
}

// Dialer makes TCP connections inside a network namespace, all on one
// thread that stays there until Close.
type Dialer struct {
	nsPath string
	reqs   chan dialReq
	stop   chan struct{}
	once   sync.Once
}

type dialReq struct {
	addr string
	out  chan dialResult
}

type dialResult struct {
	c   net.Conn
	err error
}

// NewDialer starts a dialer inside the network namespace at nsPath.
func NewDialer(nsPath string) (*Dialer, error) {
	d := &Dialer{nsPath: nsPath, reqs: make(chan dialReq), stop: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		if err := enter(nsPath); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for {
			select {
			case <-d.stop:
				return
			case r := <-d.reqs:
				c, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
				r.out <- dialResult{c, err}
			}
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return d, nil
}

// Dial connects to TCP address addr inside the namespace.
func (d *Dialer) Dial(addr string) (net.Conn, error) {
	r := dialReq{addr: addr, out: make(chan dialResult, 1)}
	select {
	case d.reqs <- r:
	case <-d.stop:
		return nil, fmt.Errorf("dial %s in %s: %w", addr, d.nsPath, errors.New("dialer closed"))
	}
	res := <-r.out
	if res.err != nil {
		return nil, fmt.Errorf("dial %s in %s: %w", addr, d.nsPath, res.err)
	}
	return res.c, nil
}

// Close ends the dialer's thread; later Dials fail.
func (d *Dialer) Close() { d.once.Do(func() { close(d.stop) }) }

// Proxy connects every connection accepted on l to one dial returns, copying
// both ways (a side's end of writing is passed on as a half close), until l
// is closed. A connection whose dial fails is closed.
func Proxy(l net.Listener, dial func() (net.Conn, error)) {
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer in.Close()
			out, err := dial()
			if err != nil {
				return
			}
			defer out.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(out, in); closeWrite(out); done <- struct{}{} }()
			go func() { _, _ = io.Copy(in, out); closeWrite(in); done <- struct{}{} }()
			<-done
			<-done
		}()
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
}
