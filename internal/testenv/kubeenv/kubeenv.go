// Package kubeenv runs a real Kubernetes control plane (kube-apiserver
// v1.37.2 + etcd v3.7.0, started by controller-runtime envtest) for
// end-to-end tests.
//
// The binaries are built once, outside the checkout, by `make peers`
// (scripts/peers/kube.sh build). Assets finds them; Start starts one control
// plane, bound to 127.0.0.1 on free ports, with its data in a temporary
// folder. No controllers and no kubelet run: Pods stay Pending until a test
// patches them, nothing garbage-collects (owner references are recorded,
// not acted on), a Pod bound to a node stays "being deleted" after a graceful
// delete (no kubelet confirms it), and a deleted Namespace stays Terminating.
//
// What a test can rely on:
//   - Start takes a few seconds on a quiet machine; share one Plane per test
//     package (see Shared) and give each test its own namespace (Namespace).
//   - The server applies its real validation, admission (ServiceAccount
//     admission is off: no controller creates default ServiceAccounts),
//     field selectors, label selectors and pagination.
//   - etcd runs with --unsafe-no-fsync: the data is throwaway.
//   - StartWith (or Shared.Options) can add an audit log (Options.Audit:
//     who called what, at Metadata level) and extra kube-apiserver flags;
//     Start runs neither.
//   - If the test binary dies without stopping the plane (a timeout panic, a
//     kill), a watchdog process kills etcd and kube-apiserver, checking each
//     by the full path of its executable, and removes their data folder, so
//     nothing outlives the binary.
package kubeenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// starting serializes plane starts in this process: a start tells its own
// processes apart from the process's other children by what appears while it
// starts (see StartWith's watchdog), which two concurrent starts would mix.
// It is the package's one piece of state, for a process-wide fact.
var starting sync.Mutex

// Version is the Kubernetes release the harness is written against and
// scripts/peers/kube.sh builds.
const Version = "v1.37.2"

// Assets returns the folder holding kube-apiserver and etcd, the one `make
// peers` writes (see testenv.Peer: the folder is
// ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/kube-v1.37.2, or
// $GDR_KUBE_DIR). If it is missing the test is skipped, except with CI=true,
// where it fails (testenv.RequirePeer).
func Assets(t testing.TB) string {
	t.Helper()
	return testenv.RequirePeer(t, testenv.Peer{Name: "kube", Version: Version, Executables: []string{"kube-apiserver", "etcd"}})
}

// Plane is one running control plane.
type Plane struct {
	// Config reaches the kube-apiserver as a cluster admin.
	Config *rest.Config

	env      *envtest.Environment
	data     string // etcd data and API server certificates
	auditLog string // "" without Options.Audit
	watchdog *watchdog
}

// Options changes how a control plane starts. The zero value is what Start
// runs.
type Options struct {
	// Audit makes kube-apiserver write an audit log (see AuditPolicy and
	// Plane.AuditLog) into the plane's data folder.
	Audit bool
	// APIServerArgs are extra kube-apiserver flags, without the leading
	// dashes ("feature-gates": "X=true"). They override the harness's own.
	APIServerArgs map[string][]string
	// ServingIPs, if set, makes the API server serve a certificate of a CA
	// of the plane's own (Config.CAData) that also names these addresses,
	// the "kubernetes" Service's first ClusterIP (10.0.0.1) and its DNS
	// names, so that Pods of a cluster built on the plane (clusterenv) verify
	// it through the Service as client-go's in-cluster configuration does.
	ServingIPs []net.IP
}

// AuditPolicy is the audit policy of a plane started with Options.Audit:
// every request at Metadata level (user, impersonated user, verb, resource,
// response code; never a request or response body, so no Secret's data),
// once its response is complete.
const AuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
`

// AuditLog returns the path of the audit log (JSON lines of audit.k8s.io/v1
// Events), "" unless the plane was started with Options.Audit. The API server
// writes each event once the request's response is complete, in blocking mode:
// an event can land just after the client saw the response.
func (p *Plane) AuditLog() string { return p.auditLog }

// Start starts etcd and kube-apiserver from the assets folder dir and waits
// until the API answers. The caller must Stop it.
func Start(dir string) (*Plane, error) { return StartWith(dir, Options{}) }

// StartWith is Start with options.
func StartWith(dir string, opts Options) (*Plane, error) {
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs) // /proc/<pid>/exe is resolved too (watchdog)
	}
	if err != nil {
		return nil, fmt.Errorf("kubeenv: assets folder %s: %w", dir, err)
	}
	// One folder for etcd's data and the API server's certificates, owned
	// here (envtest would make two), so that Stop and the watchdog remove it.
	data, err := os.MkdirTemp("", "gdr-kubeenv-")
	if err != nil {
		return nil, fmt.Errorf("kubeenv: %w", err)
	}
	etcd := &envtest.Etcd{Path: filepath.Join(abs, "etcd"), DataDir: filepath.Join(data, "etcd")}
	etcd.Configure().Set("unsafe-no-fsync", "true")
	api := &envtest.APIServer{Path: filepath.Join(abs, "kube-apiserver"), CertDir: filepath.Join(data, "certs")}
	for _, d := range []string{etcd.DataDir, api.CertDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			os.RemoveAll(data)
			return nil, fmt.Errorf("kubeenv: %w", err)
		}
	}
	var auditLog string
	if opts.Audit {
		policy := filepath.Join(data, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(AuditPolicy), 0o600); err != nil {
			os.RemoveAll(data)
			return nil, fmt.Errorf("kubeenv: %w", err)
		}
		auditLog = filepath.Join(data, "audit.log")
		api.Configure().
			Set("audit-policy-file", policy).
			Set("audit-log-path", auditLog).
			Set("audit-log-format", "json").
			Set("audit-log-mode", "blocking")
	}
	var servingCA []byte
	if len(opts.ServingIPs) > 0 {
		servingCA, err = servingCert(api.CertDir, append([]net.IP{net.IPv4(10, 0, 0, 1)}, opts.ServingIPs...))
		if err != nil {
			os.RemoveAll(data)
			return nil, err
		}
		api.SecureServing.CA = servingCA
	}
	for flag, values := range opts.APIServerArgs {
		api.Configure().Set(flag, values...)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: abs,
		// Two cores shared with compilers: the first start can be slow.
		ControlPlaneStartTimeout: 3 * time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
		ControlPlane:             envtest.ControlPlane{Etcd: etcd, APIServer: api},
	}
	// The watchdog must kill this plane's processes only, not another
	// plane's of the same binaries (a package's shared plane while a test
	// runs a cluster of its own): it watches the children that appear with
	// this start. starting keeps two starts in one process from mixing.
	starting.Lock()
	// envtest logs through controller-runtime's process-wide logger, which prints a stack
	// trace into the test's output when nothing was set; what envtest says that matters comes
	// back as Start's error.
	crlog.SetLogger(logr.Discard())
	paths := []string{filepath.Join(abs, "etcd"), filepath.Join(abs, "kube-apiserver")}
	before, _ := childrenRunning(paths)
	cfg, err := env.Start()
	var ours []string
	if err == nil {
		ours, err = childrenRunning(paths)
		ours = slices.DeleteFunc(ours, func(c string) bool { return slices.Contains(before, c) })
	}
	starting.Unlock()
	if err != nil {
		_ = env.Stop()
		os.RemoveAll(data)
		return nil, fmt.Errorf("kubeenv: start kube-apiserver and etcd from %s: %w", abs, err)
	}
	p := &Plane{Config: cfg, env: env, data: data, auditLog: auditLog}
	if p.watchdog, err = startWatchdog(data, ours); err != nil {
		_ = p.Stop()
		return nil, err
	}
	if u, err := url.Parse(cfg.Host); err != nil || u.Hostname() != "127.0.0.1" {
		_ = p.Stop()
		return nil, fmt.Errorf("kubeenv: kube-apiserver serves at %q, not on 127.0.0.1", cfg.Host)
	}
	return p, nil
}

// Stop stops kube-apiserver and etcd and removes their data folder.
func (p *Plane) Stop() error {
	if p == nil {
		return nil
	}
	err := p.env.Stop()
	if p.watchdog != nil {
		p.watchdog.close()
	}
	if rerr := os.RemoveAll(p.data); err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("kubeenv: stop control plane: %w", err)
	}
	return nil
}

// RESTConfig returns a copy of Config without client-side rate limiting (the
// client-go default of 5 requests per second would dominate every test).
func (p *Plane) RESTConfig() *rest.Config {
	c := rest.CopyConfig(p.Config)
	c.QPS, c.Burst = -1, 0
	return c
}

// Client returns a clientset for RESTConfig.
func (p *Plane) Client(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(p.RESTConfig())
	if err != nil {
		t.Fatalf("kubeenv: clientset: %v", err)
	}
	return c
}

// Namespace creates a namespace for this test only ("t-" and random hex) and
// deletes it when the test ends. The deletion is only requested: without a
// namespace controller the namespace stays Terminating, with its objects.
func (p *Plane) Namespace(t testing.TB) string {
	t.Helper()
	c := p.Client(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubeenv: create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("kubeenv: delete namespace %s: %v", name, err)
		}
	})
	return name
}

// Shared is one Plane for a whole test package, started on first use.
// Declare it next to TestMain and stop it there:
//
//	var plane kubeenv.Shared
//
//	func TestMain(m *testing.M) { code := m.Run(); plane.Stop(); os.Exit(code) }
//
// The zero value is ready to use and safe for concurrent use; set Options
// before the first Plane call to start the plane with them.
type Shared struct {
	Options Options

	mu    sync.Mutex
	plane *Plane
	err   error
	tried bool
}

// Plane returns the shared control plane, starting it on the first call. It
// skips or fails the test as Assets does when the binaries are missing, and
// fails it when the plane does not start (every later call fails the same way).
func (s *Shared) Plane(t testing.TB) *Plane {
	t.Helper()
	dir := Assets(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.tried {
		s.tried = true
		s.plane, s.err = StartWith(dir, s.Options)
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.plane
}

// Stop stops the plane if it was started. It reports a failure to stop on
// stderr: it runs after the tests, where nothing can fail any more.
func (s *Shared) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.plane.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	s.plane, s.err = nil, errors.New("kubeenv: shared control plane already stopped")
}
