package opensandboxenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// KubernetesOptions configure StartKubernetes.
type KubernetesOptions struct {
	// Kubeconfig is the path of a kubeconfig the server acts with (a
	// cluster admin's). The server gets a flattened copy (certificates and
	// keys inlined), so files it names need not be reachable from the
	// chroot. Its API server must be reachable from the machine's network
	// (127.0.0.1 is).
	Kubeconfig string
	// Namespace is where the server creates its workloads; it must exist,
	// with its default service account.
	Namespace string
	// ExecdImage is the server's execd_image, which the node must hold
	// under a tag other than "latest" (batchsandboxenv.ExecdImage).
	ExecdImage string
	// MaxSandboxTimeout is max_sandbox_timeout_seconds (whole seconds);
	// zero means MaxSandboxTimeout.
	MaxSandboxTimeout time.Duration
}

// StartKubernetes starts the lifecycle server with its Kubernetes runtime
// (`[runtime] type = "kubernetes"`, workload provider batchsandbox)
// against the cluster opts.Kubeconfig names, and registers Stop with
// t.Cleanup. The cluster must run OpenSandbox's BatchSandbox controller
// (batchsandboxenv.Start) and hold opts.ExecdImage and every image a
// sandbox names: the server sets image_pull_policy IfNotPresent.
//
// What a caller can rely on:
//   - The server runs as in Start (chroot into a read-only bind of the
//     Docker-runtime peer's root, tmpfs /tmp and /root, the config and the
//     flattened kubeconfig in the server's folder bound on /run), in
//     private mount and PID namespaces, but on the machine's network: it
//     listens on a free port of the machine's 127.0.0.1 (URL, no
//     forwarder) and reaches the API server wherever the kubeconfig says.
//     No Docker daemon runs; Docker and Expose are for Start's servers only
//     (sandboxes are Pods: they reach the machine's servers through the
//     cluster, clusterenv's Cluster.Forward).
//   - Config: namespace opts.Namespace, kubeconfig_path /run/kubeconfig,
//     workload_provider "batchsandbox", image_pull_policy "IfNotPresent",
//     informer_enabled false (every read goes to the API server, so a
//     change is seen at once), [ingress] mode "direct" (a sandbox's
//     endpoint is its Pod's IP, reachable only from the node's network),
//     a random api_key (APIKey).
//   - It returns once GET /health answers 200.
//   - Stop (also registered with t.Cleanup) kills the server (the PID
//     namespace's init) and removes the server's folder; a watchdog
//     removes the folder if the test binary dies first. Sandboxes the
//     server created are the cluster's: they go with the cluster (or their
//     expiry), not with Stop.
//
// It needs root, and the Docker-runtime peer's root (Peer; skipped on a
// developer machine without it, fails with CI=true).
func StartKubernetes(ctx context.Context, t testing.TB, opts KubernetesOptions) *Server {
	t.Helper()
	peer := testenv.RequirePeer(t, Peer)
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "opensandboxenv: the server's chroot needs root (namespaces, mounts)")
	}
	for _, tool := range []string{"unshare", "mount", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Unavailable(t, fmt.Sprintf("opensandboxenv: %s not found in PATH: %v", tool, err))
		}
	}
	if opts.Kubeconfig == "" || opts.Namespace == "" || opts.ExecdImage == "" {
		t.Fatal("opensandboxenv: StartKubernetes needs a Kubeconfig, a Namespace and an ExecdImage")
	}
	if opts.MaxSandboxTimeout == 0 {
		opts.MaxSandboxTimeout = MaxSandboxTimeout
	}
	port := testenv.FreePort(t)
	s, err := startKubernetes(ctx, t, peer, port, opts)
	return started(t, s, err, "opensandboxenv: kubernetes runtime")
}

func startKubernetes(ctx context.Context, t testing.TB, peer string, port int, opts KubernetesOptions) (*Server, error) {
	key, err := randomHex(24)
	if err != nil {
		return nil, err
	}
	// The prefix is the watchdog's (it removes only */gdr-osd-*).
	dir, err := os.MkdirTemp("", "gdr-osd-k8s-")
	if err != nil {
		return nil, err
	}
	s := &Server{APIKey: key, Dir: dir, peer: peer, log: t.Logf, URL: "http://127.0.0.1:" + strconv.Itoa(port)}
	for _, d := range []string{"srv", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	if s.watchdog, err = startWatchdog(dir, nil); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := flattenKubeconfig(opts.Kubeconfig, filepath.Join(dir, "srv", "kubeconfig")); err != nil {
		return s, err
	}
	conf := serverConfig(port, key, opts.MaxSandboxTimeout, "kubernetes", opts.ExecdImage, fmt.Sprintf(`[kubernetes]
kubeconfig_path = "/run/kubeconfig"
namespace = %q
workload_provider = "batchsandbox"
image_pull_policy = "IfNotPresent"
informer_enabled = false
`, opts.Namespace))
	if err := os.WriteFile(filepath.Join(dir, "srv", "sandbox.toml"), []byte(conf), 0o600); err != nil {
		return s, fmt.Errorf("write the server's config: %w", err)
	}
	script := fmt.Sprintf("set -eu\nD=%q\nP=%q\nR=\"$D/root\"\n%swait\n", dir, peer, serverScript())
	if err := os.WriteFile(filepath.Join(dir, "node.sh"), []byte(script), 0o644); err != nil {
		return s, fmt.Errorf("write the namespace's init script: %w", err)
	}
	logf, err := os.Create(filepath.Join(dir, "node.log"))
	if err != nil {
		return s, err
	}
	defer logf.Close()
	// Mount and PID namespaces only: the machine's network. --kill-child:
	// if unshare dies (the parent-death signal of testenv.StartProcess),
	// the init is killed, and with it the server.
	cmd := exec.Command("unshare", "--mount", "--pid", "--fork", "--kill-child",
		"--propagation", "private", "--mount-proc", "/bin/sh", filepath.Join(dir, "node.sh"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if s.node, err = testenv.StartProcess(cmd); err != nil {
		return s, fmt.Errorf("start the server's namespace: %w", err)
	}
	if s.initPID, err = childPID(s.node.PID()); err != nil {
		return s, err
	}
	if err := s.waitHealthy(ctx); err != nil {
		return s, err
	}
	return s, nil
}

// flattenKubeconfig writes the kubeconfig at src to dst (0600) with every
// file it names (certificates, keys) inlined.
func flattenKubeconfig(src, dst string) error {
	cfg, err := clientcmd.LoadFromFile(src)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", src, err)
	}
	if err := clientcmdapi.FlattenConfig(cfg); err != nil {
		return fmt.Errorf("flatten kubeconfig %s: %w", src, err)
	}
	if cfg.CurrentContext == "" {
		return errors.New("kubeconfig " + src + " has no current context")
	}
	if err := clientcmd.WriteToFile(*cfg, dst); err != nil {
		return fmt.Errorf("kubeconfig %s: %w", dst, err)
	}
	return os.Chmod(dst, 0o600)
}
