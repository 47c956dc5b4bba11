// Package jetstreamenv runs an embedded NATS server with JetStream for tests,
// and on it the assignment queue the functions share (NewQueue).
//
// Every server listens on 127.0.0.1 on a port of its own, with its HTTP
// monitoring endpoint (/jsz, /varz, ...) on another port of 127.0.0.1
// (Server.MonitorAddr), keeps its store in the test's temporary directory and
// is shut down when the test ends, so tests that use it may run in parallel
// and leave nothing behind.
//
// It imports shared/assignmentqueue: that package's own tests use it from the
// external test package assignmentqueue_test.
package jetstreamenv

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// readyTimeout bounds how long Start waits for the server to accept clients.
const readyTimeout = 10 * time.Second

// Start runs a JetStream-enabled server on a random port of 127.0.0.1 with its
// store under t.TempDir(), and returns it with its client URL. The server is
// ready for connections on return and is shut down (and waited for) by
// t.Cleanup. Start fails the test if the server does not come up.
func Start(t testing.TB) (*server.Server, string) {
	t.Helper()
	return start(t, t.TempDir(), -1, -1)
}

// Restart shuts s down and starts a new server on the same ports (clients and
// monitoring) with the same store, so streams, consumers and messages written to disk survive and clients
// connected to the old URL reconnect to the new server. The returned server is
// shut down by t.Cleanup.
func Restart(t testing.TB, s *server.Server) (*server.Server, string) {
	t.Helper()
	addr, ok := s.Addr().(*net.TCPAddr)
	if !ok {
		t.Fatalf("jetstreamenv: server has no TCP listener to restart on")
	}
	monitor := s.MonitorAddr()
	if monitor == nil {
		t.Fatalf("jetstreamenv: server has no monitoring listener to restart on")
	}
	storeDir := s.StoreDir()
	if storeDir == "" {
		t.Fatalf("jetstreamenv: server has no JetStream store to restart with")
	}
	// The server keeps its store in <StoreDir option>/jetstream; hand the
	// option back, not the directory it derived.
	if filepath.Base(storeDir) == server.JetStreamStoreDir {
		storeDir = filepath.Dir(storeDir)
	}
	s.Shutdown()
	s.WaitForShutdown()
	return start(t, storeDir, addr.Port, monitor.Port)
}

// start runs a server on port and monitoring port httpPort of 127.0.0.1 (-1:
// a free one each).
func start(t testing.TB, storeDir string, port, httpPort int) (*server.Server, string) {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		HTTPHost:  "127.0.0.1",
		HTTPPort:  httpPort,
		JetStream: true,
		StoreDir:  storeDir,
		NoLog:     true,
		NoSigs:    true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("jetstreamenv: new server: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	s.Start()
	if !s.ReadyForConnections(readyTimeout) {
		t.Fatalf("jetstreamenv: server not ready for connections within %v", readyTimeout)
	}
	if !s.JetStreamEnabled() {
		t.Fatalf("jetstreamenv: server started without JetStream")
	}
	return s, s.ClientURL()
}

// Connect opens a client connection to url and a JetStream context on it; both
// are closed by t.Cleanup. The connection retries reconnects without limit
// (every 50ms), so it survives Restart. opts are applied after those defaults.
func Connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		t.Fatalf("jetstreamenv: connect to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstreamenv: jetstream context: %v", err)
	}
	return nc, js
}
