// Package giteaenv runs a real, throwaway Gitea (v1.27.3) for end-to-end tests.
//
// The binary is built once, outside the checkout, by `make peers`
// (scripts/peers/gitea.sh build). Binary finds it; Start launches one private instance per
// call: 127.0.0.1 on a free port, SQLite and repositories in t.TempDir(), Actions enabled with
// DEFAULT_ACTIONS_URL=self, webhooks to loopback allowed, and a site admin with an all-scope API
// token. The instance is killed (its whole process group) when the test ends, and also if the
// test binary dies first (Linux: the parent-death signal; see testenv.Process).
//
// What a test can rely on:
//   - Server.URL is Gitea's ROOT_URL, with a trailing slash (as in a task's context.server_url);
//     the runner service is at URL+"api/actions", the REST API at URL+"api/v1".
//   - Every helper fails the test (t.Fatal) on any unexpected answer; none returns an error.
//   - Start takes ~2 s (server ~1 s, admin seeding ~1 s). PushWorkflow takes ~1.5 s (Gitea runs
//     its git hooks as subprocesses); the jobs then appear in Jobs, and become fetchable, ~0.2 s
//     later with Options.ChannelQueue, else up to ~2 s later (the default queue backs off up to
//     2 s). WaitJob polls every 100 ms.
//   - Restart keeps the data (database, repositories, tokens) and the port; with ChannelQueue,
//     queued webhooks and notifications in flight at Stop are lost.
//   - Only the standard library and internal/testenv (standard library only) are used here, so
//     any package's tests may import it.
//
// REST endpoints (Gitea 1.27.3) the helpers use:
//
//	POST /api/v1/user/repos                                        CreateRepo
//	POST /api/v1/admin/actions/runners/registration-token          RegistrationToken
//	GET|PUT /api/v1/repos/{o}/{r}/contents/{path}                  PushWorkflow
//	PUT /api/v1/repos/{o}/{r}/actions/secrets/{name}               SetSecret
//	POST|PUT /api/v1/repos/{o}/{r}/actions/variables/{name}        SetVariable
//	GET /api/v1/repos/{o}/{r}/actions/jobs?page=&limit=            Jobs (all runs, ascending id)
//	GET /api/v1/repos/{o}/{r}/actions/jobs/{job_id}/logs           JobLogs
//	POST /api/v1/admin/hooks                                       AddSystemWebhook
//	POST /user/login, POST /{o}/{r}/actions/runs/{run_id}/cancel   CancelRun (web routes; no REST
//	                                                               cancel exists in 1.27.3)
package giteaenv

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// Version is the Gitea release the harness is written against and scripts/peers/gitea.sh builds.
const Version = "v1.27.3"

// Binary returns the Gitea binary and its static folder (options/, templates/, public/; the
// binary has no bindata), both in the folder `make peers` writes (see testenv.Peer: the folder
// is ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/gitea-v1.27.3, or $GDR_GITEA_DIR). If they
// are missing the test is skipped, except with CI=true, where it fails (testenv.RequirePeer).
func Binary(t testing.TB) (bin, static string) {
	t.Helper()
	dir := testenv.RequirePeer(t, testenv.Peer{
		Name: "gitea", Version: Version, Executables: []string{"gitea"}, Folders: []string{"static/options"},
	})
	return filepath.Join(dir, "gitea"), filepath.Join(dir, "static")
}

// Options tune one instance. The zero value gives Gitea's defaults.
type Options struct {
	// ChannelQueue sets [queue] TYPE=channel: in-memory queues, so a pushed job becomes
	// fetchable (and its webhooks leave) ~0.2 s after the push instead of up to 2 s. Not durable.
	ChannelQueue bool
	// ZombieTaskTimeout is [actions] ZOMBIE_TASK_TIMEOUT (Gitea's default 10m when zero).
	ZombieTaskTimeout time.Duration
	// ZombieSchedule is [cron.stop_zombie_tasks] SCHEDULE, e.g. "@every 2s" (default "@every 5m").
	// The reaper also runs once at start.
	ZombieSchedule string
	// Port is the HTTP port on 127.0.0.1 (a free one when zero): a test that
	// forwards the port elsewhere before Gitea starts (clusterenv.Forward)
	// picks it first.
	Port int
	// RootHost, if set, is the host of ROOT_URL (and Server.URL) instead of
	// 127.0.0.1: an address where Gitea's port is forwarded (a cluster's
	// node, clusterenv.Forward), so that executors elsewhere reach the URLs
	// Gitea hands out (the task context's server_url, actions, checkout).
	// Gitea itself still listens on 127.0.0.1 only.
	RootHost string
	// ExtraINI is appended verbatim to app.ini (go-ini merges a repeated section, and a repeated
	// key overrides), e.g. "[actions]\nENDLESS_TASK_TIMEOUT = 30s\n".
	ExtraINI string
}

// Server is one running Gitea instance owned by a test.
type Server struct {
	// URL is the ROOT_URL, "http://127.0.0.1:<port>/" (trailing slash).
	URL string
	// AdminUser and AdminPassword log in as the site admin; AdminToken is its all-scope API token.
	AdminUser, AdminPassword, AdminToken string
	// Dir is the instance's work path (app.ini in custom/conf, data/, gitea.log).
	Dir string

	bin, conf, logPath string
	mu                 sync.Mutex
	proc               *testenv.Process
	web                *http.Client // logged-in cookie client for web routes (CancelRun)
}

// Start starts a fresh instance and seeds the admin user. It returns once /api/healthz answers.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bin, static := Binary(t)
	dir := t.TempDir()
	port := opts.Port
	if port == 0 {
		port = testenv.FreePort(t)
	}
	host := "127.0.0.1"
	if opts.RootHost != "" {
		host = opts.RootHost
	}
	s := &Server{
		URL:           fmt.Sprintf("http://%s/", net.JoinHostPort(host, strconv.Itoa(port))),
		AdminUser:     "gdr-admin",
		AdminPassword: "Gdr-" + randomHex(t, 12),
		Dir:           dir,
		bin:           bin,
		conf:          filepath.Join(dir, "custom", "conf", "app.ini"),
		logPath:       filepath.Join(dir, "gitea.log"),
	}
	if err := os.MkdirAll(filepath.Dir(s.conf), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.conf, []byte(s.appINI(t, port, static, opts)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("giteaenv: tail of %s:\n%s", s.logPath, s.LogTail(60))
		}
	})
	s.start(t)
	s.seedAdmin(t)
	return s
}

func (s *Server) appINI(t testing.TB, port int, static string, opts Options) string {
	jwt := make([]byte, 32)
	if _, err := rand.Read(jwt); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("APP_NAME = gdr-e2e\nRUN_MODE = prod\nWORK_PATH = %s\nI_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true", s.Dir)
	domain := "127.0.0.1"
	if opts.RootHost != "" {
		domain = opts.RootHost
	}
	w("\n[server]\nPROTOCOL = http\nHTTP_ADDR = 127.0.0.1\nHTTP_PORT = %d\nDOMAIN = %s\nROOT_URL = %s", port, domain, s.URL)
	w("DISABLE_SSH = true\nSTART_SSH_SERVER = false\nLFS_START_SERVER = false\nOFFLINE_MODE = true")
	w("APP_DATA_PATH = %s\nSTATIC_ROOT_PATH = %s\nGRACEFUL_HAMMER_TIME = 2s", filepath.Join(s.Dir, "data"), static)
	w("\n[database]\nDB_TYPE = sqlite3\nPATH = %s\nSQLITE_JOURNAL_MODE = WAL", filepath.Join(s.Dir, "data", "gitea.db"))
	w("\n[repository]\nROOT = %s\nDEFAULT_BRANCH = main", filepath.Join(s.Dir, "data", "repos"))
	w("\n[security]\nINSTALL_LOCK = true\nSECRET_KEY = %s\nINTERNAL_TOKEN = %s", randomHex(t, 32), randomHex(t, 32))
	w("; webhooks may target 127.0.0.1 (the default \"external\" refuses loopback)\nALLOWED_HOST_LIST = loopback")
	// JWT_SECRET also signs gitea_runtime_token: fixed here so tokens survive Restart.
	w("\n[oauth2]\nENABLED = false\nJWT_SECRET = %s", base64.RawURLEncoding.EncodeToString(jwt))
	w("\n[service]\nDISABLE_REGISTRATION = true\nENABLE_NOTIFY_MAIL = false\n\n[mailer]\nENABLED = false")
	w("\n[indexer]\nISSUE_INDEXER_TYPE = db\n\n[cron.update_checker]\nENABLED = false")
	w("\n[log]\nMODE = console\nLEVEL = Info\nROOT_PATH = %s", filepath.Join(s.Dir, "log"))
	w("\n[actions]\nENABLED = true\nDEFAULT_ACTIONS_URL = self")
	if opts.ZombieTaskTimeout > 0 {
		w("ZOMBIE_TASK_TIMEOUT = %s", opts.ZombieTaskTimeout)
	}
	if opts.ZombieSchedule != "" {
		w("\n[cron.stop_zombie_tasks]\nSCHEDULE = %s", opts.ZombieSchedule)
	}
	if opts.ChannelQueue {
		w("\n[queue]\nTYPE = channel")
	}
	if opts.ExtraINI != "" {
		w("\n%s", opts.ExtraINI)
	}
	return b.String()
}

// gitea returns a command running the binary on this instance's config.
func (s *Server) gitea(args ...string) *exec.Cmd {
	cmd := exec.Command(s.bin, append([]string{"--config", s.conf, "--work-path", s.Dir}, args...)...)
	cmd.Dir = s.Dir
	cmd.Env = append(os.Environ(),
		"GITEA_I_AM_BEING_UNSAFE_RUNNING_AS_ROOT=true", "I_AM_BEING_UNSAFE_RUNNING_AS_ROOT=true")
	return cmd
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := s.gitea("web")
	cmd.Stdout, cmd.Stderr = logf, logf
	proc, err := testenv.StartProcess(cmd) // its own group: git children die with it
	if err != nil {
		t.Fatalf("giteaenv: %v", err)
	}
	s.mu.Lock()
	s.proc = proc
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := proc.WaitReady(ctx, 50*time.Millisecond, func(context.Context) error {
		code, _, err := s.raw(http.MethodGet, "api/healthz", nil, "")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("%sapi/healthz answers %d", s.URL, code)
		}
		return err
	}); err != nil {
		t.Fatalf("giteaenv: gitea did not come up: %v; log tail:\n%s", err, s.LogTail(40))
	}
}

// kill stops exactly the process Start (or Restart) launched, with its process group:
// SIGTERM, then SIGKILL after 5 s, and waits for it. Safe to call when already stopped.
func (s *Server) kill() {
	s.mu.Lock()
	proc := s.proc
	s.proc = nil
	s.mu.Unlock()
	if proc != nil {
		proc.Stop(5 * time.Second)
	}
}

// PID is the running instance's process ID, 0 while it is stopped: for a
// measurement of Gitea's own CPU.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.PID()
}

// Stop stops the instance (a "Gitea down" period); the port then refuses connections.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.kill()
}

// Restart starts the stopped instance again on the same port and data, and waits for health.
// Web sessions do not survive it (CancelRun logs in again).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.kill()
	s.mu.Lock()
	s.web = nil
	s.mu.Unlock()
	s.start(t)
}

// LogTail returns the last n lines of the instance's log (stdout and stderr of every start).
func (s *Server) LogTail(n int) string { return testenv.LogTail(s.logPath, n) }

func (s *Server) seedAdmin(t testing.TB) {
	t.Helper()
	out, err := s.gitea("admin", "user", "create", "--username", s.AdminUser, "--password", s.AdminPassword,
		"--email", s.AdminUser+"@example.invalid", "--admin", "--must-change-password=false",
		"--access-token", "--access-token-name", "giteaenv", "--access-token-scopes", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("giteaenv: gitea admin user create: %v\n%s", err, out)
	}
	const marker = "Access token was successfully created... "
	for line := range strings.Lines(string(out)) {
		if _, tok, ok := strings.Cut(line, marker); ok {
			s.AdminToken = strings.TrimSpace(tok)
		}
	}
	if s.AdminToken == "" {
		t.Fatalf("giteaenv: no access token in the output of gitea admin user create:\n%s", out)
	}
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// LogPath is the file Gitea logs to; it logs every HTTP request it answers ("router:
// completed <METHOD> <path> for ...").
func (s *Server) LogPath() string { return s.logPath }
