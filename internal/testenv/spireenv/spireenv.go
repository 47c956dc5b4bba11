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
// signal; see testenv.Process).
//
// What a test can rely on:
//   - Start returns once the Entry API answers on the socket (about a second
//     on a quiet machine); Entries talks to it as a local, hence admin, caller.
//   - Every helper fails the test (t.Fatal) on any unexpected answer.
package spireenv

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// Version is the SPIRE release the harness is written against and
// scripts/peers/spire.sh builds.
const Version = "v1.13.3"

// TrustDomain is the trust domain every server started here serves.
const TrustDomain = "ci.example.org"

// Binary returns the spire-server binary, in the folder `make peers` writes
// (see testenv.Peer: the folder is
// ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/spire-v1.13.3, or
// $GDR_SPIRE_DIR). If it is missing the test is skipped, except with CI=true,
// where it fails (testenv.RequirePeer).
func Binary(t testing.TB) string {
	t.Helper()
	dir := testenv.RequirePeer(t, testenv.Peer{Name: "spire", Version: Version, Executables: []string{"spire-server"}})
	return filepath.Join(dir, "spire-server")
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
	proc *testenv.Process
}

// Pause stops the server process (SIGSTOP): it accepts connections (the
// kernel does) and answers none, as a server that hangs would, until Resume.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(s.proc.PID(), syscall.SIGSTOP); err != nil {
		t.Fatalf("spireenv: pause spire-server: %v", err)
	}
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(s.proc.PID(), syscall.SIGCONT); err != nil {
		t.Fatalf("spireenv: resume spire-server: %v", err)
	}
}

const configTemplate = `server {
    bind_address = "127.0.0.1"
    bind_port = "%d"
    socket_path = %q
    trust_domain = %q
    data_dir = %q
    log_level = "WARN"
%s}

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
%s}
`

// Option changes the server's configuration.
type Option func(*options)

type options struct {
	adminIDs           []spiffeid.ID
	regoPath, dataPath string
	psatCluster        string
	psatKubeconfig     string
}

// WithK8sPSAT adds the k8s_psat NodeAttestor for one cluster: agents that
// present a projected token of the ServiceAccount spire/spire-agent (audience
// spire-server), which the server reviews with the API server kubeconfig
// names, get the ID spiffe://<td>/spire/agent/k8s_psat/<cluster>/<node UID>.
func WithK8sPSAT(cluster, kubeconfig string) Option {
	return func(o *options) { o.psatCluster, o.psatKubeconfig = cluster, kubeconfig }
}

// AgentBinary returns the static spire-agent `make peers` builds beside the
// server (testenv.RequirePeer, as Binary).
func AgentBinary(t testing.TB) string {
	t.Helper()
	dir := testenv.RequirePeer(t, testenv.Peer{Name: "spire", Version: Version, Executables: []string{"spire-server", "spire-agent"}})
	return filepath.Join(dir, "spire-agent")
}

// WithAuthorizationPolicy replaces the default authorization policy with
// the rego policy and its data in these files (the server's experimental
// auth_opa_policy_engine).
func WithAuthorizationPolicy(regoPath, dataPath string) Option {
	return func(o *options) { o.regoPath, o.dataPath = regoPath, dataPath }
}

// WithShippedPolicy is WithAuthorizationPolicy with the project's own
// policy: policy.rego and policy_data.json in dir (deploy/spire, relative to
// the test), with the fields of set replacing those of the data's
// gitea_dynamic_runner object and its trust_domain the server's. The data
// file is written to a folder of the test's.
func WithShippedPolicy(t testing.TB, dir string, set map[string]any) Option {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "policy_data.json"))
	if err != nil {
		t.Fatal(err)
	}
	var data map[string]any
	if err := json.Unmarshal(raw, &data); err != nil {
		t.Fatalf("%s/policy_data.json: %v", dir, err)
	}
	gdr, ok := data["gitea_dynamic_runner"].(map[string]any)
	if !ok {
		t.Fatalf("%s/policy_data.json has no gitea_dynamic_runner object", dir)
	}
	maps.Copy(gdr, set)
	gdr["trust_domain"] = TrustDomain
	if raw, err = json.Marshal(data); err != nil {
		t.Fatal(err)
	}
	dataPath := filepath.Join(t.TempDir(), "policy_data.json")
	if err := os.WriteFile(dataPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	regoPath, err := filepath.Abs(filepath.Join(dir, "policy.rego"))
	if err != nil {
		t.Fatal(err)
	}
	return WithAuthorizationPolicy(regoPath, dataPath)
}

// WithAdminIDs makes ids admins (the server's admin_ids): a caller
// presenting an X.509-SVID of one of them over the TCP API has the same
// rights as a local caller on the socket.
func WithAdminIDs(ids ...spiffeid.ID) Option {
	return func(o *options) { o.adminIDs = append(o.adminIDs, ids...) }
}

// Start starts a fresh server and returns once its Entry API answers.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	var extra string
	if len(o.adminIDs) > 0 {
		extra = "    admin_ids = ["
		for i, id := range o.adminIDs {
			if i > 0 {
				extra += ", "
			}
			extra += strconv.Quote(id.String())
		}
		extra += "]\n"
	}
	if o.regoPath != "" {
		extra += fmt.Sprintf("    experimental {\n        auth_opa_policy_engine {\n            local {\n"+
			"                rego_path = %q\n                policy_data_path = %q\n            }\n        }\n    }\n", o.regoPath, o.dataPath)
	}
	var plugins string
	if o.psatCluster != "" {
		plugins = fmt.Sprintf("    NodeAttestor \"k8s_psat\" {\n        plugin_data {\n            clusters = {\n"+
			"                %q = {\n                    service_account_allow_list = [\"spire:spire-agent\"]\n"+
			"                    kube_config_file = %q\n                }\n            }\n        }\n    }\n", o.psatCluster, o.psatKubeconfig)
	}
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
		port := testenv.FreePort(t)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		conf := filepath.Join(dir, "server.conf")
		data := fmt.Sprintf(configTemplate, port, s.Socket, TrustDomain, filepath.Join(dir, "data"), extra,
			filepath.Join(dir, "data", "datastore.sqlite3"), plugins)
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
	p, err := testenv.StartProcess(cmd)
	if err != nil {
		return fmt.Errorf("spireenv: %w", err)
	}
	s.proc = p
	stop := func() { p.Stop(10 * time.Second) }
	conn, err := grpc.NewClient("unix://"+s.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		return fmt.Errorf("spireenv: dial %s: %w", s.Socket, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	entries := entryv1.NewEntryClient(conn)
	if err := p.WaitReady(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := entries.CountEntries(ctx, &entryv1.CountEntriesRequest{})
		return err
	}); err != nil {
		conn.Close()
		stop()
		return fmt.Errorf("spireenv: spire-server did not come up: %w\n%s", err, testenv.LogTail(logPath, 60))
	}
	s.conn = conn
	t.Cleanup(func() {
		conn.Close()
		_ = syscall.Kill(p.PID(), syscall.SIGCONT) // a paused server takes SIGTERM only once continued
		stop()
		if t.Failed() {
			t.Logf("spireenv: spire-server log:\n%s", testenv.LogTail(logPath, 60))
		}
	})
	return nil
}

// Bundle returns the trust domain's X.509 bundle in PEM (what an agent
// bootstraps with), from `spire-server bundle show`.
func (s *Server) Bundle(t testing.TB) []byte {
	t.Helper()
	out, err := exec.Command(Binary(t), "bundle", "show", "-socketPath", s.Socket).Output()
	if err != nil {
		t.Fatalf("spireenv: bundle show: %v", err)
	}
	return out
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
