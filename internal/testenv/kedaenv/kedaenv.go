// Package kedaenv runs KEDA's operator (v2.21.0) against a test's control
// plane (kubeenv), so that a ScaledJob is acted on as in a cluster.
//
// The operator and KEDA's CRDs are built and copied once, outside the
// checkout, by `make peers` (scripts/peers/keda.sh build). Assets finds them;
// Start installs the CRDs into the API server and starts the operator as a
// child process of the test binary. Only the operator runs: ScaledJobs need
// neither KEDA's metrics API server nor its admission webhooks.
//
// What a test can rely on:
//   - Every listener of the operator (metrics, health probes, its gRPC
//     metrics service) is on a free port of 127.0.0.1; it has no webhook
//     server and no leader election. Its kubeconfig, certificates and log are
//     in a temporary folder.
//   - It talks to the API server with the credentials of the rest.Config it
//     was given (a cluster admin for kubeenv), at most 20 requests per second
//     (KEDA's default).
//   - Start returns once the operator's readiness probe answers; a controller
//     may take a moment longer to pick up an object.
//   - Jobs it creates never run in a bare kubeenv plane (no controller
//     manager, no kubelet): they stay without status, and KEDA counts them as
//     running.
//   - It is stopped when the test ends, and also if the test binary dies
//     first (Linux: the parent-death signal; see testenv.Process). Its log is
//     printed when the test failed.
package kedaenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// Version is the KEDA release the harness is written against and
// scripts/peers/keda.sh builds.
const Version = "v2.21.0"

// ObjectNamespace is the operator's own namespace (KEDA_CLUSTER_OBJECT_NAMESPACE
// and POD_NAMESPACE): where it would look for the Secrets of
// ClusterTriggerAuthentications. Start creates it if it is missing.
const ObjectNamespace = "keda"

// Assets returns the folder holding keda-operator and crds/, the one `make
// peers` writes (see testenv.Peer: the folder is
// ${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/keda-v2.21.0, or
// $GDR_KEDA_DIR). If it is missing the test is skipped, except with CI=true,
// where it fails (testenv.RequirePeer).
func Assets(t testing.TB) string {
	t.Helper()
	return testenv.RequirePeer(t, testenv.Peer{Name: "keda", Version: Version, Executables: []string{"keda-operator"}, Folders: []string{"crds"}})
}

// Options changes how Start runs the operator. The zero value watches every
// namespace.
type Options struct {
	// WatchNamespace limits the operator to one namespace (WATCH_NAMESPACE);
	// "" watches all.
	WatchNamespace string
}

// Operator is one running keda-operator.
type Operator struct {
	// MetricsAddr, ProbeAddr and MetricsServiceAddr are the host:port of its
	// Prometheus metrics, its health probes (/healthz, /readyz) and its gRPC
	// metrics service, all on 127.0.0.1.
	MetricsAddr, ProbeAddr, MetricsServiceAddr string

	logPath string

	mu       sync.Mutex
	proc     *testenv.Process
	stopped  bool
	restarts int
}

// maxRestarts bounds how often the operator is started again after it
// exited on its own (see supervise).
const maxRestarts = 3

// PID is the operator's current process ID.
func (o *Operator) PID() int { return o.current().PID() }

// Exited is closed once the operator's current process has exited.
func (o *Operator) Exited() <-chan struct{} { return o.current().Exited() }

func (o *Operator) current() *testenv.Process {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.proc
}

// supervise starts the operator again when it exits before the test ends,
// at most maxRestarts times, as its Deployment's restart policy does in a
// cluster: controller-runtime stops the whole operator when one informer
// does not sync within its timeout, which a loaded machine can cause. The
// log says each restart.
func (o *Operator) supervise(start func() (*testenv.Process, error)) {
	for {
		p := o.current()
		<-p.Exited()
		o.mu.Lock()
		if o.stopped || o.restarts >= maxRestarts {
			o.mu.Unlock()
			return
		}
		o.restarts++
		next, err := start()
		if err != nil {
			o.mu.Unlock()
			return
		}
		o.proc = next
		o.mu.Unlock()
	}
}

// LogTail returns the last n lines of the operator's log (stdout and stderr).
func (o *Operator) LogTail(n int) string { return testenv.LogTail(o.logPath, n) }

// Start installs KEDA's CRDs into the API server cfg reaches (InstallCRDs),
// creates ObjectNamespace, and starts the operator with cfg's credentials.
// It fails the test if any step fails or the operator is not ready within
// ctx. The operator is stopped when the test ends.
func Start(ctx context.Context, t testing.TB, cfg *rest.Config, opts Options) *Operator {
	t.Helper()
	dir := Assets(t)
	if err := InstallCRDs(ctx, cfg, filepath.Join(dir, "crds")); err != nil {
		t.Fatal(err)
	}
	if err := ensureNamespace(ctx, cfg, ObjectNamespace); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := writeKubeconfig(cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	certDir, caDir := filepath.Join(work, "certs"), filepath.Join(work, "ca")
	for _, d := range []string{certDir, caDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatalf("kedaenv: %v", err)
		}
	}
	if err := writeServingCert(certDir); err != nil {
		t.Fatal(err)
	}
	loopback := func() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t))) }
	o := &Operator{MetricsAddr: loopback(), ProbeAddr: loopback(), MetricsServiceAddr: loopback(), logPath: filepath.Join(work, "keda-operator.log")}
	// One log across restarts: each start appends, after a line saying so.
	start := func() (*testenv.Process, error) {
		logf, err := os.OpenFile(o.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		defer logf.Close() // the child holds its own descriptor
		if o.restarts > 0 {
			fmt.Fprintf(logf, "kedaenv: keda-operator exited; start %d\n", o.restarts+1)
		}
		cmd := exec.Command(filepath.Join(dir, "keda-operator"),
			"--metrics-bind-address="+o.MetricsAddr,
			"--health-probe-bind-address="+o.ProbeAddr,
			"--metrics-service-bind-address="+o.MetricsServiceAddr,
			"--profiling-bind-address=",
			"--leader-elect=false",
			"--enable-cert-rotation=false",
			"--cert-dir="+certDir,
			"--ca-dir="+caDir,
			"--zap-log-level=info",
			"--zap-encoder=console",
		)
		cmd.Dir = work
		// Its whole environment: nothing of the test's (proxies, credentials) leaks in.
		cmd.Env = []string{
			"HOME=" + work,
			"KUBECONFIG=" + kubeconfig,
			"WATCH_NAMESPACE=" + opts.WatchNamespace,
			"KEDA_CLUSTER_OBJECT_NAMESPACE=" + ObjectNamespace,
			"POD_NAMESPACE=" + ObjectNamespace,
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		return testenv.StartProcess(cmd)
	}
	proc, err := start()
	if err != nil {
		t.Fatalf("kedaenv: %v", err)
	}
	o.proc = proc
	go o.supervise(start)
	t.Cleanup(func() {
		o.mu.Lock()
		o.stopped = true
		p := o.proc
		o.mu.Unlock()
		p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("kedaenv: tail of keda-operator's log %s:\n%s", o.logPath, o.LogTail(80))
		}
	})
	readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute) // two cores shared with compilers
	defer cancel()
	if err := o.current().WaitReady(readyCtx, 200*time.Millisecond, o.ready); err != nil {
		t.Fatalf("kedaenv: keda-operator: %v", err) // the cleanup prints its log
	}
	return o
}

// ready asks the operator's readiness probe.
func (o *Operator) ready(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+o.ProbeAddr+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz answered %s", resp.Status)
	}
	return nil
}

// InstallCRDs creates every CustomResourceDefinition in the YAML files of dir
// (KEDA's crds/ folder), leaving one that exists already as it is, and waits
// until each is Established.
func InstallCRDs(ctx context.Context, cfg *rest.Config, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("kedaenv: no CRDs in %s (%v)", dir, err)
	}
	c, err := apiextensions.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kedaenv: apiextensions client: %w", err)
	}
	crds := c.ApiextensionsV1().CustomResourceDefinitions()
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("kedaenv: %w", err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(data, &crd); err != nil {
			return fmt.Errorf("kedaenv: CRD file %s: %w", f, err)
		}
		if crd.Kind != "CustomResourceDefinition" || crd.Name == "" {
			return fmt.Errorf("kedaenv: %s holds a %q named %q, not a CustomResourceDefinition", f, crd.Kind, crd.Name)
		}
		if _, err := crds.Create(ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kedaenv: create CRD %s: %w", crd.Name, err)
		}
		names = append(names, crd.Name)
	}
	for _, name := range names {
		for {
			crd, err := crds.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("kedaenv: CRD %s: %w", name, err)
			}
			if established(crd) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("kedaenv: CRD %s not established: %w", name, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// ensureNamespace creates namespace name unless it exists.
func ensureNamespace(ctx context.Context, cfg *rest.Config, name string) error {
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kedaenv: clientset: %w", err)
	}
	_, err = c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kedaenv: create namespace %s: %w", name, err)
	}
	return nil
}

// writeKubeconfig writes a kubeconfig file (mode 0600) reaching the server of
// cfg with cfg's credentials, inlined.
func writeKubeconfig(cfg *rest.Config, path string) error {
	if cfg.ExecProvider != nil || cfg.AuthProvider != nil {
		return errors.New("kedaenv: a rest.Config with an exec or auth provider cannot be written as a kubeconfig here")
	}
	read := func(data []byte, file string) ([]byte, error) {
		if len(data) > 0 || file == "" {
			return data, nil
		}
		return os.ReadFile(file)
	}
	ca, err := read(cfg.CAData, cfg.CAFile)
	if err != nil {
		return fmt.Errorf("kedaenv: kubeconfig: %w", err)
	}
	cert, err := read(cfg.CertData, cfg.CertFile)
	if err != nil {
		return fmt.Errorf("kedaenv: kubeconfig: %w", err)
	}
	key, err := read(cfg.KeyData, cfg.KeyFile)
	if err != nil {
		return fmt.Errorf("kedaenv: kubeconfig: %w", err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["plane"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: ca, InsecureSkipTLSVerify: cfg.Insecure, TLSServerName: cfg.ServerName}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cert, ClientKeyData: key,
		Token: cfg.BearerToken, TokenFile: cfg.BearerTokenFile,
		Username: cfg.Username, Password: cfg.Password,
		Impersonate: cfg.Impersonate.UserName, ImpersonateGroups: cfg.Impersonate.Groups,
	}
	kc.Contexts["plane"] = &clientcmdapi.Context{Cluster: "plane", AuthInfo: "admin"}
	kc.CurrentContext = "plane"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("kedaenv: write kubeconfig: %w", err)
	}
	return os.Chmod(path, 0o600)
}

// writeServingCert writes the certificate KEDA's gRPC metrics service serves
// with (tls.crt, tls.key) and the CA it trusts for clients (ca.crt) into dir:
// one self-signed certificate for 127.0.0.1, valid for a day. Without them
// the service fails to start and takes the operator down (cert rotation,
// which would make them, needs KEDA's Services and webhooks).
func writeServingCert(dir string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("kedaenv: serving key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "keda-operator"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("kedaenv: serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("kedaenv: serving key: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	for name, data := range map[string][]byte{
		"ca.crt":  certPEM,
		"tls.crt": certPEM,
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return fmt.Errorf("kedaenv: %w", err)
		}
	}
	return nil
}
