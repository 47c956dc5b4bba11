// Package natscluster runs a NATS JetStream cluster of nats-server
// processes on 127.0.0.1, for the tests that kill, stop, pause and restart
// servers: the chaos run and the cluster-consistency tests.
//
// Server i (0-based, named n1, n2, ...) listens for clients, routes and HTTP
// monitoring on three ports of its own and keeps its JetStream store in a
// folder of its own. A restarted server gets the same ports and the same
// store, so clients given URLs reconnect to it and it rejoins the cluster
// with what it had written. No TLS and no authentication: every stream is in
// the default account $G.
//
// Every server is a child of the test binary (testenv.StartProcess): on Linux
// the kernel kills it if the test binary dies, and Close (registered by
// StartT) ends them all, so no server outlives the test.
//
// Leaders are read from the servers' monitoring endpoints (/jsz), only from
// servers that are running and not paused: the leader is the one server that
// names itself leader. A follower keeps naming a killed leader until it
// elects another (nats-server's election timeout, 4 to 9 s), so a leader read
// right after a kill is a new one or ErrNoLeader, never the dead one. A
// leader also counts a member current until it has not heard from it for
// 10 s, so the waits that need members current (WaitHealthy,
// WaitStreamCurrent) also need them running and not paused, as the Cluster
// knows.
//
// The times to expect of nats-server 2.15 on one machine: a cluster of three
// is healthy within a second of Start; a SIGKILLed leader (meta or stream) is
// replaced after an election timeout, 4 to 9 s; a SIGTERMed meta leader hands
// over as it shuts down, in about 0.1 s; a restarted server is back, meta
// leader heard and streams caught up, in about 3 s.
package natscluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// Build builds nats-server (github.com/nats-io/nats-server/v2, at the version
// the module requires) into dir with `go build` and returns its path. It runs
// in the current directory, which must be inside the module (a test's is).
func Build(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "nats-server")
	args := []string{"build", "-o", bin, "github.com/nats-io/nats-server/v2"}
	if out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("natscluster: go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return bin, nil
}

const (
	// pollInterval is how often the waits ask the servers again.
	pollInterval = 100 * time.Millisecond
	// closeGrace is how long Close lets a server shut down after SIGTERM.
	closeGrace = 5 * time.Second
	// startTimeout bounds StartT's Start.
	startTimeout = 60 * time.Second
)

// ErrNoLeader is returned (wrapped) when no running, unpaused server names
// itself the leader asked for: there is none, or it is being elected.
var ErrNoLeader = errors.New("no leader")

// Option changes a Cluster from its defaults.
type Option func(*options)

type options struct {
	name string // the cluster's name
	logs string // folder of the servers' logs; "" for each server's own
}

// WithName names the cluster (cluster.name; default "gdr").
func WithName(name string) Option { return func(o *options) { o.name = name } }

// WithLogDir has the servers append their output to <dir>/n1.log,
// <dir>/n2.log, ... instead of nats.log in each server's folder.
func WithLogDir(dir string) Option { return func(o *options) { o.logs = dir } }

// Cluster is n nats-server processes forming one cluster, each with
// JetStream. Its methods may be called concurrently. A server index i runs
// from 0 to n-1; an index out of range panics.
type Cluster struct {
	bin  string
	opts options
	mon  monitor

	mu      sync.Mutex
	servers []*server
	started bool
	closed  bool
}

// server is one member; its fields other than proc and paused are fixed by
// Start.
type server struct {
	name                   string
	client, route, monitor int
	dir, conf, log, store  string

	proc   *testenv.Process // nil: not running (never started, killed or stopped)
	paused bool
}

// New returns a cluster of n servers (not started) that will run bin (see
// Build) and keep server i's configuration, store and (unless WithLogDir)
// log in <dir>/n<i+1>. Three servers is the smallest cluster that keeps a
// quorum with one of them down.
func New(bin, dir string, n int, opts ...Option) *Cluster {
	o := options{name: "gdr"}
	for _, opt := range opts {
		opt(&o)
	}
	c := &Cluster{bin: bin, opts: o, mon: newMonitor()}
	for i := range n {
		name := "n" + strconv.Itoa(i+1)
		sdir := filepath.Join(dir, name)
		log := filepath.Join(sdir, "nats.log")
		if o.logs != "" {
			log = filepath.Join(o.logs, name+".log")
		}
		c.servers = append(c.servers, &server{name: name, dir: sdir, conf: filepath.Join(sdir, "nats.conf"),
			log: log, store: filepath.Join(sdir, "store")})
	}
	return c
}

// StartT starts a cluster of n servers (New, Start) in folders under
// t.TempDir() and registers its Close with t.Cleanup. It fails the test if
// the cluster is not healthy within a minute. The cleanup of a failed test
// logs the tail of every server's log.
func StartT(t testing.TB, bin string, n int, opts ...Option) *Cluster {
	t.Helper()
	c := New(bin, t.TempDir(), n, opts...)
	t.Cleanup(func() {
		c.Close()
		if t.Failed() {
			t.Logf("natscluster: the servers' logs end:%s", c.tails(logLines))
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// logLines is how many lines of each server's log a failed test shows.
const logLines = 30

// tails returns the last n lines of every server's log.
func (c *Cluster) tails(n int) string {
	var b strings.Builder
	for _, s := range c.servers {
		fmt.Fprintf(&b, "\n--- %s (%s):\n%s", s.name, s.log, testenv.LogTail(s.log, n))
	}
	return b.String()
}

// Start picks the servers' ports, writes their configuration files, starts
// them all and waits until the cluster is healthy (WaitHealthy). Start may be
// called once; the caller must Close the cluster whether it succeeds or not.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	if c.started || c.closed {
		c.mu.Unlock()
		return errors.New("natscluster: Start called twice, or after Close")
	}
	c.started = true
	c.mu.Unlock()
	if len(c.servers) == 0 {
		return errors.New("natscluster: a cluster of no servers")
	}
	ports, err := testenv.FreePorts(3 * len(c.servers))
	if err != nil {
		return fmt.Errorf("natscluster: %w", err)
	}
	for i, s := range c.servers {
		s.client, s.route, s.monitor = ports[3*i], ports[3*i+1], ports[3*i+2]
	}
	for _, s := range c.servers {
		if err := c.writeConfig(s); err != nil {
			return err
		}
	}
	for i := range c.servers {
		if err := c.spawn(i); err != nil {
			return err
		}
	}
	if err := c.healthy(ctx); err != nil {
		return fmt.Errorf("natscluster: cluster %s not healthy: %w", c.opts.name, err)
	}
	return nil
}

// writeConfig writes s's configuration file: its three ports, its store,
// the cluster's name and a route to every other server.
func (c *Cluster) writeConfig(s *server) error {
	var routes strings.Builder
	for _, p := range c.servers {
		if p != s {
			fmt.Fprintf(&routes, "    nats-route://127.0.0.1:%d\n", p.route)
		}
	}
	conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream {
  store_dir: %q
}
cluster {
  name: %s
  listen: 127.0.0.1:%d
  routes: [
%s  ]
}
`, s.name, s.client, s.monitor, s.store, c.opts.name, s.route, routes.String())
	for _, d := range []string{s.dir, filepath.Dir(s.log)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("natscluster: %s: %w", s.name, err)
		}
	}
	if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("natscluster: %s: %w", s.name, err)
	}
	return nil
}

// spawn starts server i's process (nats-server -c <conf>), its output
// appended to its log.
func (c *Cluster) spawn(i int) error {
	s := c.servers[i]
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("natscluster: %s: %w", s.name, err)
	}
	defer logf.Close()
	cmd := exec.Command(c.bin, "-c", s.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("natscluster: %s: the cluster is closed", s.name)
	}
	if s.running() {
		return fmt.Errorf("natscluster: %s is running", s.name)
	}
	p, err := testenv.StartProcess(cmd)
	if err != nil {
		return fmt.Errorf("natscluster: %s: %w", s.name, err)
	}
	s.proc, s.paused = p, false
	return nil
}

// running reports whether s's process has been started and has not exited.
// The caller holds c.mu.
func (s *server) running() bool {
	if s.proc == nil {
		return false
	}
	select {
	case <-s.proc.Exited():
		return false
	default:
		return true
	}
}

// Restart starts server i again after Kill or Stop (or a crash), on the same
// ports with the same store, and waits until it is healthy (its /healthz
// answers ok, so its streams have caught up) and the meta leader counts it
// current. It fails if server i is running.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	if err := c.spawn(i); err != nil {
		return err
	}
	s := c.servers[i]
	err := c.poll(ctx, func(ctx context.Context) error {
		if err := c.mon.healthz(ctx, s); err != nil {
			return err
		}
		return c.metaCurrent(ctx, i)
	})
	if err != nil {
		return fmt.Errorf("natscluster: %s not back: %w\n%s", s.name, err, testenv.LogTail(s.log, 15))
	}
	return nil
}

// take marks server i not running and returns its process, or an error if
// it is not running.
func (c *Cluster) take(i int) (p *testenv.Process, paused bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.servers[i]
	if !s.running() {
		return nil, false, fmt.Errorf("natscluster: %s is not running", s.name)
	}
	p, paused = s.proc, s.paused
	s.proc, s.paused = nil, false
	return p, paused, nil
}

// Kill ends server i with SIGKILL (paused or not) and returns once it has
// exited: its ports are closed and its store is as the crash left it.
func (c *Cluster) Kill(i int) error {
	p, _, err := c.take(i)
	if err != nil {
		return err
	}
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		return fmt.Errorf("natscluster: kill %s: %w", c.servers[i].name, err)
	}
	<-p.Exited()
	return nil
}

// Stop ends server i with SIGTERM (nats-server's orderly shutdown; SIGKILL
// once grace has passed) and returns once it has exited. A paused server is
// resumed first so that it can shut down.
func (c *Cluster) Stop(i int, grace time.Duration) error {
	p, paused, err := c.take(i)
	if err != nil {
		return err
	}
	if paused {
		_ = syscall.Kill(p.PID(), syscall.SIGCONT)
	}
	p.Stop(grace)
	return nil
}

// Pause stops server i with SIGSTOP and returns once the kernel reports it
// stopped (Linux; elsewhere once the signal is sent). A paused server keeps
// its ports open but answers nothing, as a hung server does; the other
// servers see it only through timeouts. Resume, Kill, Stop and Close end a
// pause.
func (c *Cluster) Pause(ctx context.Context, i int) error {
	c.mu.Lock()
	s := c.servers[i]
	if !s.running() || s.paused {
		c.mu.Unlock()
		return fmt.Errorf("natscluster: %s is not running, or paused already", s.name)
	}
	pid := s.proc.PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		c.mu.Unlock()
		return fmt.Errorf("natscluster: pause %s: %w", s.name, err)
	}
	s.paused = true
	c.mu.Unlock()
	for !stopped(pid) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("natscluster: pause %s: %w", s.name, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// stopped reports whether process pid is in the stopped state (T in
// /proc/<pid>/stat); true where there is no /proc.
func stopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses, the state
	// follows the last ')'.
	_, rest, ok := strings.Cut(string(b[strings.LastIndexByte(string(b), ')')+1:]), " ")
	return ok && strings.HasPrefix(rest, "T")
}

// Resume continues server i after Pause (SIGCONT). It does not wait for the
// server to catch up: see WaitHealthy and WaitStreamCurrent.
func (c *Cluster) Resume(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.servers[i]
	if !s.running() || !s.paused {
		return fmt.Errorf("natscluster: %s is not paused", s.name)
	}
	if err := syscall.Kill(s.proc.PID(), syscall.SIGCONT); err != nil {
		return fmt.Errorf("natscluster: resume %s: %w", s.name, err)
	}
	s.paused = false
	return nil
}

// Close ends every running server (resumed if paused; SIGTERM, SIGKILL after
// 5 s) and waits for them. Nothing can be started after Close; calling it
// again does nothing.
func (c *Cluster) Close() {
	c.mu.Lock()
	c.closed = true
	type member struct {
		p      *testenv.Process
		paused bool
	}
	var live []member
	for _, s := range c.servers {
		if s.running() {
			live = append(live, member{s.proc, s.paused})
		}
		s.proc, s.paused = nil, false
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, m := range live {
		wg.Go(func() {
			if m.paused {
				_ = syscall.Kill(m.p.PID(), syscall.SIGCONT)
			}
			m.p.Stop(closeGrace)
		})
	}
	wg.Wait()
}

// Len is the number of servers.
func (c *Cluster) Len() int { return len(c.servers) }

// Name is server i's server name (n1 for 0), as leaders and replicas are
// named in nats-server's answers.
func (c *Cluster) Name(i int) string { return c.servers[i].name }

// Index is the index of the server named name, or -1.
func (c *Cluster) Index(name string) int {
	for i, s := range c.servers {
		if s.name == name {
			return i
		}
	}
	return -1
}

// URL is server i's client URL, nats://127.0.0.1:<port> (set by Start).
func (c *Cluster) URL(i int) string { return "nats://127.0.0.1:" + strconv.Itoa(c.servers[i].client) }

// URLs are all the servers' client URLs, comma-separated, for nats.Connect:
// a client fails over to another server when its own goes down.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.servers))
	for i := range c.servers {
		urls[i] = c.URL(i)
	}
	return strings.Join(urls, ",")
}

// MonitorAddr is server i's HTTP monitoring address, 127.0.0.1:<port> (set
// by Start).
func (c *Cluster) MonitorAddr(i int) string {
	return "127.0.0.1:" + strconv.Itoa(c.servers[i].monitor)
}

// Log is the path of the file server i appends its output to.
func (c *Cluster) Log(i int) string { return c.servers[i].log }

// live returns the indexes of the servers running and not paused.
func (c *Cluster) live() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, s := range c.servers {
		if s.running() && !s.paused {
			out = append(out, i)
		}
	}
	return out
}

// crashed returns an error naming a server that exited without Kill, Stop or
// Close, with the tail of its log; nil if none did.
func (c *Cluster) crashed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.servers {
		if s.proc != nil && !s.running() {
			return fmt.Errorf("%s exited on its own:\n%s", s.name, testenv.LogTail(s.log, 15))
		}
	}
	return nil
}

// poll calls check every pollInterval until it returns nil. It fails at
// once if a server crashes, and when ctx ends (wrapping check's last error).
func (c *Cluster) poll(ctx context.Context, check func(context.Context) error) error {
	for {
		if err := c.crashed(); err != nil {
			return err
		}
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(pollInterval):
		}
	}
}
