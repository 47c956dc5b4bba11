//go:build e2e

package netns_test

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/netns"
)

// TestE2ENetnsExposeAndDial: a server of the machine's on 127.0.0.1:P is
// exposed at 127.0.0.1:P inside a new network namespace (its own loopback:
// the port is free there), a connection made inside reaches it through the
// proxy, and each side's half close passes through.
func TestE2ENetnsExposeAndDial(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "netns: setns needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		testenv.Unavailable(t, "netns: unshare not found: "+err.Error())
	}
	// The machine's echo server: it answers "machine:" and what it read
	// until the client's half close, then closes.
	l0, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l0.Close()
	go func() {
		for {
			c, err := l0.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				_, _ = c.Write(append([]byte("machine:"), b...))
			}()
		}
	}()

	up := filepath.Join(t.TempDir(), "up")
	ns := exec.Command("unshare", "--net", "sh", "-c", `ip link set lo up && : >"$1" && exec sleep 60`, "sh", up)
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Process.Kill(); _ = ns.Wait() }()
	path := netns.Path(ns.Process.Pid)

	var l1 net.Listener
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Once lo is up in the namespace.
		if _, err = os.Stat(up); err == nil {
			if l1, err = netns.Listen(path, l0.Addr().String()); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("listen in the namespace: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer l1.Close()
	var proxied atomic.Int32
	go netns.Proxy(l1, func() (net.Conn, error) {
		proxied.Add(1)
		return net.Dial("tcp", l0.Addr().String())
	})

	d, err := netns.NewDialer(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := d.Dial(l0.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "machine:ping" {
		t.Fatalf("through the namespace: %q, %v; want \"machine:ping\"", got, err)
	}
	// The dialer is inside: it reached the machine through the proxy
	// (the same address on the machine is the server itself).
	if n := proxied.Load(); n != 1 {
		t.Fatalf("the proxy carried %d connections, want 1", n)
	}
	if _, err := d.Dial("127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("dial of a closed port in the namespace: %v", err)
	}
	d.Close()
	if _, err := d.Dial(l0.Addr().String()); err == nil {
		t.Fatal("a closed dialer dialled")
	}
}
