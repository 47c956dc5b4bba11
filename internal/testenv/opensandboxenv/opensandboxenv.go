// Package opensandboxenv runs a real OpenSandbox lifecycle server with its
// Docker runtime for end-to-end tests: the upstream Python server (FastAPI
// on uvicorn) at the pinned commit, a Docker engine (Debian's docker.io
// 20.10 with containerd and runc) and the execd image the server injects
// into every sandbox.
//
// Everything comes from one peer, built once outside the checkout by
// `make peers` (scripts/peers/opensandbox.sh): a Debian trixie root holding
// python3 and the server's dependencies with the server's source in
// /opt/server, the unpacked Docker engine, execd built from the pinned
// source, and a static busybox. Start skips the test on a developer machine
// without it and fails it with CI=true (testenv.RequirePeer).
//
// What Start guarantees:
//   - dockerd, containerd, every sandbox container and the lifecycle server
//     run in private mount, network and PID namespaces of their own
//     (unshare from util-linux), never in the machine's. Inside, /run is a
//     fresh tmpfs (containerd's shim sockets), /etc an overlay whose upper
//     layer is in the server's folder (dockerd writes /etc/docker/key.json),
//     and dockerd's data and exec roots are in the server's folder: nothing
//     reaches the machine's /run, /etc or /var/lib/docker.
//   - Networking: the namespace has only lo. dockerd runs with
//     --bridge=none and no iptables, forwarding or masquerading, so it
//     never touches the machine's (or even the namespace's) packet filter;
//     the server's sandboxes use network_mode "host", which is the
//     namespace's: execd's port 44772 of every sandbox is bound inside it,
//     where the lifecycle server (also inside) reaches it, and nothing a
//     sandbox listens on can collide with the machine's or another test's
//     ports. The test process reaches the lifecycle server through a
//     forwarder of the harness: it listens on a free port of the machine's
//     127.0.0.1 (URL) and connects each connection to the server's
//     127.0.0.1:8080 inside the namespace with a socket made on an OS thread
//     moved there with setns (package netns). The other way, Expose makes a
//     server of the machine's 127.0.0.1:<port> (Gitea, a gateway) reachable
//     at the same address inside the namespace, hence from every sandbox,
//     so the URLs a test hands out work unchanged there. Nothing listens
//     beyond 127.0.0.1 on the machine. (Running without a network
//     namespace would have put every sandbox's execd on the machine's port
//     44772.)
//   - The lifecycle server runs with chroot in a read-only bind of the
//     peer's root: tests never write into the peer. Its /tmp and /root are
//     tmpfs (its SQLite store is /tmp/opensandbox.db), /run is the folder
//     holding the Docker socket and its config.
//   - Containers' cgroups live under a relative --cgroup-parent, gdr-osd-<hex>,
//     below the test process's own cgroup in every hierarchy (dockerd's
//     default, /docker, would move them out of it); Stop removes those
//     folders.
//   - No registry is reachable and nothing is pulled: the execd image
//     (ExecdImage) and the sandbox image (SandboxImage: busybox and the
//     project's runner) are built as root filesystem tars here and loaded
//     with `docker import`; with Options.JobImage, an OCI layout (`make
//     images`' runner-host) too, as JobImageName.
//   - The server's API key is random per Start; max_sandbox_timeout_seconds
//     is 86400.
//   - Stop (also registered with t.Cleanup) kills the namespace's init, and
//     with it every process of the namespace (dockerd, containerd, shims,
//     containers, the server), removes the cgroup folders and the server's
//     folder. If the test binary dies first, the kernel kills unshare
//     (parent-death signal), whose --kill-child kills the namespace's init;
//     a watchdog shell then removes the cgroup folders and the folder.
//
// Needs root (namespaces, mounts, cgroups).
package opensandboxenv

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/netns"
)

// Version is the OpenSandbox commit the peer is built from.
const Version = "4db3a993"

// Peer is the build of scripts/peers/opensandbox.sh.
var Peer = testenv.Peer{
	Name: "opensandbox", Version: Version,
	Executables: []string{
		"execd", "busybox", "bootstrap.sh",
		"docker/usr/sbin/dockerd", "docker/usr/bin/docker", "docker/usr/bin/containerd", "docker/usr/sbin/runc",
		"root/usr/bin/python3",
	},
	Folders: []string{"root/opt/server/opensandbox_server"},
}

// Image names loaded into the server's Docker engine.
const (
	// ExecdImage holds /execd and /bootstrap.sh on busybox, as the server
	// expects of its runtime.execd_image.
	ExecdImage = "gdr-test/opensandbox-execd:" + Version
	// SandboxImage holds busybox (a /bin/sh for the server's bootstrap
	// wrapper) and the project's runner at RunnerPath.
	SandboxImage = "gdr-test/opensandbox-sandbox:latest"
	// RunnerPath is where SandboxImage holds functions/runner.
	RunnerPath = "/usr/local/bin/runner"
)

// MaxSandboxTimeout is the server's max_sandbox_timeout_seconds.
const MaxSandboxTimeout = 86400 * time.Second

// serverPort is where the lifecycle server listens inside the namespace.
const serverPort = 8080

// Options configure Start.
type Options struct {
	// NoRunner leaves the runner out of SandboxImage (it then holds busybox
	// only), which saves building functions/runner.
	NoRunner bool
	// JobImage, if set, is the folder of an OCI image layout (`make
	// images` writes bin/images/runner-host) imported as JobImageName:
	// its image for this machine's architecture, flattened, with its user,
	// environment and working directory. It must hold /bin/sh.
	JobImage string
}

// Server is a running lifecycle server with its Docker engine.
type Server struct {
	// URL is the lifecycle server's base URL on the machine's 127.0.0.1
	// (routes are served at / and /v1).
	URL string
	// APIKey is the server's api_key, random per Start.
	APIKey string
	// Dir is the server's folder: logs (dockerd.log, server.log,
	// node.log), Docker's data, the config. Removed by Stop.
	Dir string

	peer     string
	cgroup   string   // the relative cgroup parent, "gdr-osd-<hex>"
	cgDirs   []string // the absolute cgroup folders containers go under
	node     *testenv.Process
	initPID  int
	listener net.Listener
	dialer   *netns.Dialer
	proxyMu  sync.Mutex
	exposed  []net.Listener // Expose's listeners inside the namespace
	stopped  bool
	watchdog *watchdog
	log      func(format string, args ...any)

	stopOnce sync.Once
	stopErr  error
}

// Start starts dockerd and the lifecycle server (see the package doc) and
// registers Stop with t.Cleanup. It returns once GET /health answers 200
// and both images are loaded.
func Start(ctx context.Context, t testing.TB, opts Options) *Server {
	t.Helper()
	peer := testenv.RequirePeer(t, Peer)
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "opensandboxenv: dockerd needs root (namespaces, mounts, cgroups)")
	}
	for _, tool := range []string{"unshare", "mount", "ip", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Unavailable(t, fmt.Sprintf("opensandboxenv: %s not found in PATH: %v", tool, err))
		}
	}
	s, err := start(ctx, t, peer, opts)
	return started(t, s, err, "opensandboxenv")
}

// started registers s's Stop (and its logs when the test failed) with
// t.Cleanup, whatever err says, and fails the test with err, prefixed by
// what, after dumping s's logs.
func started(t testing.TB, s *Server, err error, what string) *Server {
	t.Helper()
	if s != nil {
		t.Cleanup(func() {
			if t.Failed() {
				s.DumpLogs(t)
			}
			if err := s.Stop(); err != nil {
				t.Errorf("opensandboxenv: %v", err)
			}
		})
	}
	if err != nil {
		if s != nil {
			s.DumpLogs(t)
		}
		t.Fatalf("%s: %v", what, err)
	}
	return s
}

func start(ctx context.Context, t testing.TB, peer string, opts Options) (*Server, error) {
	id, err := randomHex(6)
	if err != nil {
		return nil, err
	}
	key, err := randomHex(24)
	if err != nil {
		return nil, err
	}
	// Short: the Docker and containerd socket paths below it must fit in
	// sun_path (108 bytes).
	dir, err := os.MkdirTemp("", "gdr-osd-")
	if err != nil {
		return nil, err
	}
	s := &Server{APIKey: key, Dir: dir, peer: peer, cgroup: "gdr-osd-" + id, log: t.Logf}
	if s.cgDirs, err = cgroupDirs(s.cgroup); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	for _, d := range []string{"srv", "root", "etc-upper", "etc-work", "data", "exec", "images", "docker-cli"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	if s.watchdog, err = startWatchdog(dir, s.cgDirs); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := s.writeConfig(); err != nil {
		return s, err
	}
	if err := s.startNode(); err != nil {
		return s, err
	}
	if s.initPID, err = childPID(s.node.PID()); err != nil {
		return s, err
	}
	if err := s.waitDocker(ctx); err != nil {
		return s, err
	}
	if err := s.loadImages(ctx, opts); err != nil {
		return s, err
	}
	s.dialer, err = netns.NewDialer(netns.Path(s.initPID))
	if err != nil {
		return s, err
	}
	if s.listener, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return s, fmt.Errorf("listen for the forwarder: %w", err)
	}
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(serverPort))
	go netns.Proxy(s.listener, func() (net.Conn, error) { return s.dialer.Dial(target) })
	s.URL = "http://" + s.listener.Addr().String()
	if err := os.WriteFile(filepath.Join(dir, "server-go"), nil, 0o644); err != nil {
		return s, err
	}
	if err := s.waitHealthy(ctx); err != nil {
		return s, err
	}
	return s, nil
}

// writeConfig writes the server's config (with the API key, so 0600) and the
// namespace's init script.
func (s *Server) writeConfig() error {
	conf := serverConfig(serverPort, s.APIKey, MaxSandboxTimeout, "docker", ExecdImage, `[docker]
network_mode = "host"
`)
	if err := os.WriteFile(filepath.Join(s.Dir, "srv", "sandbox.toml"), []byte(conf), 0o600); err != nil {
		return err
	}
	// The init of the namespaces. /etc: an overlay (dockerd writes
	// /etc/docker/key.json). The server's root: a read-only bind of the
	// peer's, with its own /proc, /dev, tmpfs /tmp and /root, and srv/ (the
	// Docker socket and the config) as /run. It waits for server-go: the
	// harness loads the images first, so the server never tries to pull.
	script := fmt.Sprintf(`set -eu
D=%q
P=%q
CG=%q
R="$D/root"
export PATH="$P/docker/usr/sbin:$P/docker/usr/bin:/usr/sbin:/usr/bin:/sbin:/bin"
mount -t tmpfs -o mode=0755 gdr-osd-run /run
mount -t overlay gdr-osd-etc -o "lowerdir=/etc,upperdir=$D/etc-upper,workdir=$D/etc-work" /etc
ip link set lo up
dockerd --data-root "$D/data" --exec-root "$D/exec" -H "unix://$D/srv/docker.sock" -p "$D/dockerd.pid" \
  --iptables=false --ip6tables=false --bridge=none --ip-forward=false --ip-masq=false --userland-proxy=false \
  --cgroup-parent "$CG" --storage-driver overlay2 >"$D/dockerd.log" 2>&1 &
while [ ! -e "$D/server-go" ]; do sleep 0.1; done
%swait
`, s.Dir, s.peer, s.cgroup, serverScript("DOCKER_HOST=unix:///run/docker.sock"))
	return os.WriteFile(filepath.Join(s.Dir, "node.sh"), []byte(script), 0o644)
}

// startNode starts the init of new mount, network and PID namespaces.
// --kill-child: if unshare dies (the parent-death signal of
// testenv.StartProcess), the init is killed, and with it the namespace.
func (s *Server) startNode() error {
	logf, err := os.Create(filepath.Join(s.Dir, "node.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("unshare", "--mount", "--net", "--pid", "--fork", "--kill-child",
		"--propagation", "private", "--mount-proc", "/bin/sh", filepath.Join(s.Dir, "node.sh"))
	cmd.Stdout, cmd.Stderr = logf, logf
	s.node, err = testenv.StartProcess(cmd)
	return err
}

// childPID is the only child of pid (unshare's forked init).
func childPID(pid int) (int, error) {
	for range 100 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if err != nil {
			return 0, err
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			return strconv.Atoi(f[0])
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0, fmt.Errorf("unshare (pid %d) has no child", pid)
}

// Docker runs the peer's docker CLI against the server's engine (for a
// test to look at containers) and returns its combined output.
func (s *Server) Docker(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.peer, "docker/usr/bin/docker"),
		append([]string{"-H", "unix://" + filepath.Join(s.Dir, "srv", "docker.sock")}, args...)...)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+filepath.Join(s.Dir, "docker-cli"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// waitDocker waits until dockerd answers on its socket.
func (s *Server) waitDocker(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err := s.node.WaitReady(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		_, err := s.Docker(ctx, "version", "--format", "{{.Server.Version}}")
		return err
	})
	if err != nil {
		return fmt.Errorf("dockerd: %w", err)
	}
	return nil
}

// waitHealthy waits for GET /health to answer 200.
func (s *Server) waitHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: 5 * time.Second}
	err := s.node.WaitReady(ctx, 250*time.Millisecond, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /health: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lifecycle server: %w", err)
	}
	return nil
}

// Expose makes a server of the machine's, listening at hostAddr
// (127.0.0.1:<port>), reachable inside the server's network namespace at
// the same address: the namespace has a loopback of its own, on which the
// harness listens on that port and forwards every connection to hostAddr on
// the machine, until Stop. Sandboxes use the namespace's network, so a URL
// the test hands out (Gitea's ROOT_URL, a gateway's https://127.0.0.1:<port>)
// works unchanged inside them. It fails if the port is taken in the
// namespace (the server's 8080, execd's 44772).
func (s *Server) Expose(hostAddr string) error {
	host, port, err := net.SplitHostPort(hostAddr)
	if err != nil {
		return fmt.Errorf("opensandboxenv: expose %s: %w", hostAddr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("opensandboxenv: expose %s: want a loopback address of the machine", hostAddr)
	}
	l, err := netns.Listen(netns.Path(s.initPID), net.JoinHostPort(host, port))
	if err != nil {
		return fmt.Errorf("opensandboxenv: expose %s: %w", hostAddr, err)
	}
	s.proxyMu.Lock()
	defer s.proxyMu.Unlock()
	if s.stopped {
		_ = l.Close()
		return fmt.Errorf("opensandboxenv: expose %s: the server is stopped", hostAddr)
	}
	s.exposed = append(s.exposed, l)
	go netns.Proxy(l, func() (net.Conn, error) { return net.DialTimeout("tcp", hostAddr, 5*time.Second) })
	return nil
}

// cgroupDirs returns, for every cgroup hierarchy the test process is in
// (v1, and the v2 "unified" one of a hybrid layout) and that is mounted under
// /sys/fs/cgroup, the folder of the relative cgroup parent name below the
// process's own cgroup: where dockerd (a descendant that never moves) and
// runc put containers.
func cgroupDirs(name string) ([]string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseCgroupDirs(f, "/sys/fs/cgroup", name)
}

// parseCgroupDirs reads a /proc/<pid>/cgroup file from r and returns the
// folder name would have below the process's cgroup in each hierarchy that
// exists under root.
func parseCgroupDirs(r io.Reader, root, name string) ([]string, error) {
	var dirs []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		// The v2 line ("0::/path"): in a hybrid layout runc makes the
		// container's folder in the unified hierarchy too.
		hier := strings.TrimPrefix(parts[1], "name=")
		base := filepath.Join(root, hier)
		if hier == "" {
			base = filepath.Join(root, "unified")
			if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
				base = root // v2 only
			}
		}
		if _, err := os.Stat(base); err != nil {
			continue
		}
		dirs = append(dirs, filepath.Join(base, parts[2], name))
	}
	return dirs, sc.Err()
}

// removeCgroups removes the cgroup folders, deepest first, retrying while
// the last processes leave.
func (s *Server) removeCgroups() error {
	var left []string
	for range 50 {
		left = left[:0]
		for _, root := range s.cgDirs {
			if _, err := os.Stat(root); err != nil {
				continue
			}
			var dirs []string
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				_ = syscall.Rmdir(dirs[i])
			}
			if _, err := os.Stat(root); err == nil {
				left = append(left, root)
			}
		}
		if len(left) == 0 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("cgroup folders left: %s", strings.Join(left, ", "))
}

// Stop tears everything down (see the package doc); calling it again
// returns the first call's error.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		var errs []error
		if s.listener != nil {
			_ = s.listener.Close()
		}
		if s.dialer != nil {
			s.dialer.Close()
		}
		s.proxyMu.Lock()
		s.stopped = true
		for _, l := range s.exposed {
			_ = l.Close()
		}
		s.proxyMu.Unlock()
		if s.node != nil {
			s.node.Stop(10 * time.Second) // unshare, then its init: the PID namespace ends
			if s.initPID > 0 {
				for range 100 {
					if _, err := os.Stat(fmt.Sprintf("/proc/%d", s.initPID)); err != nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
		if err := s.removeCgroups(); err != nil {
			errs = append(errs, err)
		}
		if os.Getenv("GDR_KEEP_OPENSANDBOX_DIR") == "" {
			if err := os.RemoveAll(s.Dir); err != nil {
				errs = append(errs, err)
			}
		} else {
			s.log("opensandboxenv: kept %s", s.Dir)
		}
		if s.watchdog != nil {
			s.watchdog.release()
		}
		if len(errs) > 0 {
			s.stopErr = fmt.Errorf("stop: %w", errors.Join(errs...))
		}
	})
	return s.stopErr
}

// DumpLogs logs the tail of the namespace's, dockerd's and the server's
// logs (for a failing test).
func (s *Server) DumpLogs(t testing.TB) {
	t.Helper()
	for _, name := range []string{"node", "dockerd", "server"} {
		t.Logf("--- %s.log (tail)\n%s", name, testenv.LogTail(filepath.Join(s.Dir, name+".log"), 40))
	}
}

// ServerLog returns the lifecycle server's log so far.
func (s *Server) ServerLog() string {
	b, err := os.ReadFile(filepath.Join(s.Dir, "server.log"))
	if err != nil {
		return err.Error()
	}
	return string(b)
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
