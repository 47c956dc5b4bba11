// Package spireenv runs a real, throwaway SPIRE server (v1.13.3) for
// end-to-end tests.
//
// The binary is built once, outside the checkout, by `make peers`
// (scripts/peers/spire.sh build). Binary finds it; Start launches one private
// server per call: trust domain ci.example.org, a sqlite datastore in a
// temporary folder, the memory KeyManager (a self-signed CA), the join_token
// NodeAttestor, the agent/server API on 127.0.0.1 at a free port and the
// admin API on a short unix socket path. The server is killed when the test
// ends, and also if the test binary dies first (Linux: the parent-death
// signal).
//
// What a test can rely on:
//   - Start returns once the Entry API answers on the socket (about a second
//     on a quiet machine); Entries talks to it as a local, hence admin, caller.
//   - Every helper fails the test (t.Fatal) on any unexpected answer.
package spireenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Version is the SPIRE release the harness is written against and
// scripts/peers/spire.sh builds.
const Version = "v1.13.3"

// TrustDomain is the trust domain every server started here serves.
const TrustDomain = "ci.example.org"

// Binary returns the spire-server binary: $GDR_SPIRE_SERVER_BIN if set, else
// ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/spire-v1.13.3/spire-server
// written by `make peers`. If it is missing the test is skipped, except with
// CI=true, where it fails: CI must never pass without the real peer.
func Binary(t testing.TB) string {
	t.Helper()
	var missing string
	bin := os.Getenv("GDR_SPIRE_SERVER_BIN")
	if bin == "" {
		root := os.Getenv("GDR_PEERS")
		if root == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				t.Fatalf("spireenv: no home directory and no GDR_PEERS: %v", err)
			}
			root = filepath.Join(home, ".cache", "gitea-dynamic-runner")
		}
		dir := filepath.Join(root, "spire-"+Version)
		bin = filepath.Join(dir, "spire-server")
		if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
			missing = dir + " is not a complete build"
		}
	}
	if missing == "" {
		if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = bin + " is not an executable file"
		}
	}
	if missing != "" {
		msg := "spireenv: spire-server " + Version + " not built (" + missing + "): run `make peers`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " (CI=true: a missing peer is a failure)")
		}
		t.Skip(msg)
	}
	return bin
}

// Server is one running spire-server owned by a test.
type Server struct {
	TrustDomain spiffeid.TrustDomain
	// Socket is the admin API's unix socket.
	Socket string
	// Addr is the agent/server API address, 127.0.0.1:<port>.
	Addr string
	// Dir holds the configuration, the datastore and server.log.
	Dir string

	conn *grpc.ClientConn
}

const configTemplate = `server {
    bind_address = "127.0.0.1"
    bind_port = "%d"
    socket_path = %q
    trust_domain = %q
    data_dir = %q
    log_level = "WARN"
}

plugins {
    DataStore "sql" {
        plugin_data {
            database_type = "sqlite3"
            connection_string = %q
        }
    }
    KeyManager "memory" {
        plugin_data {}
    }
    NodeAttestor "join_token" {
        plugin_data {}
    }
}
`

// Start starts a fresh server and returns once its Entry API answers.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	// A unix socket path must fit in 108 bytes: t.TempDir() (named after the
	// test) may not.
	sockDir, err := os.MkdirTemp("", "gdr-spire-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	s := &Server{
		TrustDomain: spiffeid.RequireTrustDomainFromString(TrustDomain),
		Socket:      filepath.Join(sockDir, "api.sock"),
		Dir:         dir,
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken before the server binds it
		port := freePort(t)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		conf := filepath.Join(dir, "server.conf")
		data := fmt.Sprintf(configTemplate, port, s.Socket, TrustDomain, filepath.Join(dir, "data"),
			filepath.Join(dir, "data", "datastore.sqlite3"))
		if err := os.WriteFile(conf, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if lastErr = s.run(t, bin, conf); lastErr == nil {
			return s
		}
	}
	t.Fatal(lastErr)
	return nil
}

// run starts the process and waits for the API; on failure the process is
// gone and the error quotes the end of its log.
func (s *Server) run(t testing.TB, bin, conf string) error {
	t.Helper()
	logPath := filepath.Join(s.Dir, "server.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "run", "-config", conf)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()

	p := &process{cmd: cmd, exited: make(chan struct{})}
	if err := p.start(); err != nil {
		return fmt.Errorf("spireenv: start %s: %w", bin, err)
	}
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
		}
	}
	conn, err := grpc.NewClient("unix://"+s.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		return fmt.Errorf("spireenv: dial %s: %w", s.Socket, err)
	}
	if err := waitReady(conn, p.exited, 60*time.Second); err != nil {
		conn.Close()
		stop()
		return fmt.Errorf("spireenv: spire-server did not come up: %w\n%s", err, tail(logPath))
	}
	s.conn = conn
	t.Cleanup(func() {
		conn.Close()
		stop()
		if t.Failed() {
			t.Logf("spireenv: spire-server log:\n%s", tail(logPath))
		}
	})
	return nil
}

// process runs one child. Start and Wait happen on one locked OS thread,
// because the parent-death signal follows the thread that forked the child:
// the thread stays alive as long as the child does.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func (p *process) start() error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := p.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	return <-started
}

func waitReady(conn *grpc.ClientConn, exited <-chan struct{}, timeout time.Duration) error {
	client := entryv1.NewEntryClient(conn)
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("the process exited")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = client.CountEntries(ctx, &entryv1.CountEntriesRequest{})
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("no answer in %s: %w", timeout, err)
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(bytes.TrimSpace(data))
}

// Conn is the admin API connection (unix socket, a local caller).
func (s *Server) Conn() grpc.ClientConnInterface { return s.conn }

// Entries is the Entry API client on Conn.
func (s *Server) Entries() entryv1.EntryClient { return entryv1.NewEntryClient(s.conn) }

// AllEntries lists every registration entry.
func (s *Server) AllEntries(t testing.TB) []*types.Entry {
	t.Helper()
	var (
		out   []*types.Entry
		token string
	)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := s.Entries().ListEntries(ctx, &entryv1.ListEntriesRequest{PageSize: 500, PageToken: token})
		cancel()
		if err != nil {
			t.Fatalf("spireenv: list entries: %v", err)
		}
		out = append(out, resp.GetEntries()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out
		}
	}
}
