//go:build e2e

package kedaenv

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kubeenv"
)

var plane kubeenv.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	plane.Stop()
	os.Exit(code)
}

// TestE2EOperatorListensOnLoopback: the operator Start runs is the one built
// from Version, and listens on loopback only, on exactly the addresses
// Operator names. (The shipped ScaledJob of handle under this operator is
// deploy's TestE2EKEDAScalesHandlePod.)
func TestE2EOperatorListensOnLoopback(t *testing.T) {
	Assets(t) // skip before starting anything when the operator is not built
	p := plane.Plane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	op := Start(ctx, t, p.RESTConfig(), Options{WatchNamespace: p.Namespace(t)})

	if log, err := os.ReadFile(op.logPath); err != nil || !strings.Contains(string(log), "KEDA Version: "+strings.TrimPrefix(Version, "v")) {
		t.Errorf("the operator's log does not report KEDA %s (%v)", Version, err)
	}
	// The operator opens its listeners as its parts start (the metrics service's after its
	// informers sync): wait until every one it must open is up, then judge the set.
	want := []string{op.MetricsAddr, op.ProbeAddr, op.MetricsServiceAddr}
	slices.Sort(want)
	var listening []string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
		l, err := listeners(op.PID())
		if err != nil {
			t.Fatal(err)
		}
		listening = l
		if !slices.ContainsFunc(want, func(a string) bool { return !slices.Contains(l, a) }) || time.Now().After(deadline) {
			break
		}
	}
	slices.Sort(listening)
	if !slices.Equal(listening, want) {
		t.Errorf("keda-operator listens on %v, want exactly %v", listening, want)
	}
}

// listeners returns the TCP addresses (host:port) process pid listens on,
// read from /proc: its socket descriptors matched against the listening
// sockets of its network namespace.
func listeners(pid int) ([]string, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var addrs []string
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] { // 0A: LISTEN
				continue
			}
			addr, err := procAddr(fields[1])
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("/proc/%d/net/%s: %w", pid, table, err)
			}
			addrs = append(addrs, addr)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return addrs, nil
}

// procAddr decodes an address of /proc/net/tcp{,6}: hex IP in host byte order
// per 32-bit word (little-endian here), colon, hex port.
func procAddr(s string) (string, error) {
	host, port, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(host)
	if !ok || err != nil || (len(b) != 4 && len(b) != 16) {
		return "", fmt.Errorf("address %q", s)
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return "", fmt.Errorf("address %q: %w", s, err)
	}
	return net.JoinHostPort(net.IP(b).String(), strconv.FormatUint(p, 10)), nil
}

// TestE2EOperatorStartsAgainAfterItExits: killed (as controller-runtime stops it when an informer
// does not sync in time), the operator is started again and becomes ready, as its Deployment's
// restart policy would do in a cluster.
func TestE2EOperatorStartsAgainAfterItExits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := plane.Plane(t)
	op := Start(ctx, t, p.Config, Options{WatchNamespace: "default"})
	first := op.PID()
	exited := op.Exited()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited // the fault: the first process is gone
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if op.PID() != first && op.ready(ctx) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the operator was not started again and ready within 2 minutes; log:\n%s", op.LogTail(40))
		}
	}
	if !strings.Contains(op.LogTail(200), "keda-operator exited; start 2") {
		t.Error("the restart is not in the operator's log")
	}
}
