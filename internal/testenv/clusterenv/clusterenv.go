// Package clusterenv runs a real single-node Kubernetes cluster for
// end-to-end tests: the control plane of kubeenv (kube-apiserver + etcd),
// kube-scheduler, kube-controller-manager, and one node: containerd (with
// runc and the CNI plugins) and a kubelet, all v1.37.2.
//
// The binaries are built once, outside the checkout, by `make peers`:
// scripts/peers/kube.sh (API server, etcd) and scripts/peers/kube-node.sh
// (scheduler, controller-manager, kubelet from the Go module proxy;
// containerd 2.4 and runc 1.5 built from the Go module proxy, which offer
// Kubernetes user namespaces; the CNI plugins from Debian's packages). Start
// skips the test on a developer machine without them and fails it with
// CI=true (testenv.RequirePeer).
//
// What Start guarantees:
//   - The node runs in private mount, network and PID namespaces of its own
//     (unshare from util-linux). Inside, /run and /var/lib are fresh tmpfs
//     mounts (the kubelet and containerd write fixed paths there:
//     /var/lib/kubelet/device-plugins, /var/lib/cni, /run/containerd), so
//     nothing the node writes reaches the machine's own /run or /var/lib,
//     and every mount the node makes (overlay root filesystems, Pod network
//     namespaces) lives and dies with its mount namespace.
//   - Every server listens on 127.0.0.1 of the machine, or inside the
//     node's own network namespace: the kubelet on the node's address, which
//     the API server reaches through a veth pair (host side: a /30 of
//     10.254.0.0/16 on an interface named gdrh<hex>, removed by Stop); the
//     kubelet reaches the API server through a proxy the harness listens
//     with on 127.0.0.1:6443 inside the node's namespace.
//   - ServiceAccount admission is on (kubeenv turns it off): every Pod gets
//     a projected token, signed by the API server. A Pod created right after
//     its namespace may be refused until the controller-manager has made the
//     namespace's "default" ServiceAccount (WaitServiceAccount).
//   - Pods get addresses from a CNI bridge (cni0, host-local IPAM,
//     10.244.0.0/24) inside the node's namespace.
//   - The kubelet's cgroups live under a cgroupRoot of the node's own
//     (/gdr-node-<hex> in every cgroup hierarchy), removed by Stop.
//   - One cluster at a time per machine: Start waits for an flock on
//     LockFile, held until Stop.
//   - The kubelet changes kernel sysctls that are not namespaced
//     (vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
//     kernel.panic_on_oops, kernel.keys.root_maxkeys,
//     kernel.keys.root_maxbytes): Start records them and Stop restores them.
//   - Stop (also registered with t.Cleanup) kills the node's PID namespace
//     (every process of the node, containers and shims included, dies with
//     it), stops the scheduler, controller-manager and control plane,
//     removes the veth, the cgroups and the data folder, and restores the
//     sysctls. If the test binary dies first, the kernel kills unshare
//     (parent-death signal), which kills the namespace's init, which ends the
//     whole namespace; the veth goes with the namespace; a watchdog process
//     then removes the cgroups and the folder and restores the sysctls.
//
// No registry is reachable: images are built locally (internal/imagebuild)
// and imported into containerd (Cluster.ImportImage); Pods must use
// imagePullPolicy Never or IfNotPresent. The sandbox ("pause") image is
// built from ./testdata/pause and imported by Start.
package clusterenv

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/imagebuild"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kubeenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/netns"
)

// Version is the Kubernetes release of every component.
const Version = kubeenv.Version

// NodeName is the name the node registers with.
const NodeName = "gdr-node"

// PauseImage is the sandbox image Start imports and containerd uses.
const PauseImage = "gdr.local/pause:latest"

// apiPortInNode is where the kubelet finds the API server, on 127.0.0.1 of
// the node's network namespace (the harness's proxy).
const apiPortInNode = 6443

// kubeletSysctls are the sysctls (under /proc/sys) the kubelet sets and Stop
// restores.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// IDsPerPod is the node's kubelet's userNamespaces.idsPerPod: the IDs a Pod
// with hostUsers: false gets, as many as a node for docker pools with user
// namespaces needs (shared/backend/pod's DockerIDsPerPod; deploy's docker
// test keeps the two equal).
const IDsPerPod = 4 * 65536

// NodeVersion is the version of scripts/peers/kube-node.sh's folder: the
// Kubernetes release it serves and the containerd it builds.
const NodeVersion = Version + "-containerd-v2.4.2"

// NodeAssets returns the folder of scripts/peers/kube-node.sh's build, the
// node's runtime (skipping or failing the test as testenv.RequirePeer does).
func NodeAssets(t testing.TB) string {
	t.Helper()
	return testenv.RequirePeer(t, testenv.Peer{Name: "kube-node", Version: NodeVersion, Executables: []string{
		"bin/containerd", "bin/containerd-shim-runc-v2", "bin/ctr", "bin/runc", "bin/nft",
		"cni/bridge", "cni/host-local", "cni/loopback",
	}})
}

// KubeAssets returns the folder of scripts/peers/kube.sh's build with the
// node's Kubernetes commands checked too (kubeenv.Assets checks the control
// plane's only).
func KubeAssets(t testing.TB) string {
	t.Helper()
	return testenv.RequirePeer(t, testenv.Peer{Name: "kube", Version: Version, Executables: []string{
		"kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "kubelet", "kube-proxy",
	}})
}

// Cluster is one running cluster.
type Cluster struct {
	// Plane is the control plane (kube-apiserver + etcd).
	Plane *kubeenv.Plane
	// Dir holds every file of the cluster's own: configs, logs, data.
	Dir string

	nodeBin   string // kube-node peer folder: the runtime
	kubeBin   string // kube peer folder: the Kubernetes commands
	id        string // hex, names the cgroupRoot and the host veth
	hostIf    string
	nodeIP    string
	sysctls   map[string]string
	cgroupDir string // "/gdr-node-<id>"
	procs     []*testenv.Process
	node      *testenv.Process // unshare
	nodePID   int              // the namespace's init, as the machine sees it
	proxyMu   sync.Mutex
	proxies   []net.Listener // in the node's namespace: the API server's, Forward's
	watchdog  *watchdog
	lock      *os.File // flock'd: one cluster per machine (sysctls are global)
	stopOnce  sync.Once
	stopErr   error
	log       func(format string, args ...any)
}

// Start starts the whole cluster and waits until the node is Ready. It
// registers Stop with t.Cleanup. Needs root (namespaces, cgroups, sysctls).
func Start(ctx context.Context, t testing.TB) *Cluster {
	t.Helper()
	kubeDir := KubeAssets(t)
	nodeDir := NodeAssets(t)
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "clusterenv: the node needs root (namespaces, cgroups, sysctls)")
	}
	c, err := start(ctx, t, kubeDir, nodeDir)
	if c != nil {
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		if c != nil {
			c.dumpLogs(t)
		}
		t.Fatalf("clusterenv: %v", err)
	}
	return c
}

func start(ctx context.Context, t testing.TB, kubeDir, nodeDir string) (*Cluster, error) {
	var b [3]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "gdr-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		Dir: dir, nodeBin: nodeDir, kubeBin: kubeDir, id: id, hostIf: "gdrh" + id,
		cgroupDir: "/gdr-node-" + id, sysctls: map[string]string{},
		log: t.Logf,
	}
	// The /30 of the veth pair: 10.254.<b1>.<b2&0xfc>: .1 here, .2 the node.
	hostIP := fmt.Sprintf("10.254.%d.%d", b[1], (b[2]&0xfc)+1)
	c.nodeIP = fmt.Sprintf("10.254.%d.%d", b[1], (b[2]&0xfc)+2)

	if c.lock, err = lockMachine(ctx); err != nil {
		return c, err
	}
	for _, s := range kubeletSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", s))
		if err != nil {
			return c, fmt.Errorf("record sysctl %s: %w", s, err)
		}
		c.sysctls[s] = strings.TrimSpace(string(v))
	}

	// From here on the machine holds state of the node's: the watchdog
	// undoes it if the test binary dies without Stop.
	if c.watchdog, err = startWatchdog(c); err != nil {
		return c, err
	}
	c.Plane, err = kubeenv.StartWith(kubeDir, kubeenv.Options{
		APIServerArgs: map[string][]string{
			"kubelet-preferred-address-types": {"InternalIP"},
			// envtest disables ServiceAccount admission (no controller makes
			// the default ServiceAccount there); here the controller-manager
			// does, and Pods get their projected token, as in a real cluster.
			"disable-admission-plugins": {""},
			// The "kubernetes" Service's endpoint: the node's address, where
			// the harness forwards to the API server (Pods reach it through
			// kube-proxy, as in-cluster clients do).
			"advertise-address": {c.nodeIP},
		},
		ServingIPs: []net.IP{net.ParseIP(c.nodeIP)},
	})
	if err != nil {
		return c, err
	}
	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := writeKubeconfig(kubeconfig, c.Plane.Config, ""); err != nil {
		return c, err
	}
	nodeKubeconfig := filepath.Join(dir, "node.kubeconfig")
	if err := writeKubeconfig(nodeKubeconfig, c.Plane.Config, fmt.Sprintf("https://127.0.0.1:%d", apiPortInNode)); err != nil {
		return c, err
	}

	// Scheduler and controller-manager, on the machine's 127.0.0.1.
	if err := c.startControl(t, "kube-scheduler", filepath.Join(kubeDir, "kube-scheduler"),
		"--kubeconfig="+kubeconfig, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
		"--leader-elect=false", "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", testenv.FreePort(t)),
		"--cert-dir="+filepath.Join(dir, "scheduler-certs")); err != nil {
		return c, err
	}
	if err := c.startControl(t, "kube-controller-manager", filepath.Join(kubeDir, "kube-controller-manager"),
		"--kubeconfig="+kubeconfig, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
		"--leader-elect=false", "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", testenv.FreePort(t)),
		"--cert-dir="+filepath.Join(dir, "controller-manager-certs"),
		// No --service-account-private-key-file: the token controller stays off.
		"--use-service-account-credentials=false"); err != nil {
		return c, err
	}

	// The node's own cgroupRoot, in every hierarchy.
	if err := c.makeCgroups(); err != nil {
		return c, err
	}
	if err := c.writeNodeConfig(); err != nil {
		return c, err
	}
	if err := c.startNode(ctx); err != nil {
		return c, err
	}
	if err := waitFile(ctx, c.node, filepath.Join(dir, "ns-ready")); err != nil {
		return c, fmt.Errorf("node namespace: %w", err)
	}
	if c.nodePID, err = childPID(c.node.PID()); err != nil {
		return c, err
	}
	// veth: host side here, eth0 in the node's namespace.
	nsPID := fmt.Sprint(c.nodePID)
	for _, args := range [][]string{
		{"link", "add", c.hostIf, "type", "veth", "peer", "name", "eth0", "netns", nsPID},
		{"addr", "add", hostIP + "/30", "dev", c.hostIf},
		{"link", "set", c.hostIf, "up"},
	} {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			return c, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, args := range [][]string{
		{"addr", "add", c.nodeIP + "/30", "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", hostIP},
	} {
		full := append([]string{"-t", nsPID, "-n", "ip"}, args...)
		if out, err := exec.CommandContext(ctx, "nsenter", full...).CombinedOutput(); err != nil {
			return c, fmt.Errorf("nsenter %s: %w: %s", strings.Join(full, " "), err, out)
		}
	}
	// The kubelet's (and kube-proxy's) way to the API server:
	// 127.0.0.1:6443 in its namespace; the Pods': the "kubernetes"
	// Service's endpoint, the node's address and the API server's port.
	u, err := url.Parse(c.Plane.Config.Host)
	if err != nil {
		return c, err
	}
	if err := c.forward(fmt.Sprintf("127.0.0.1:%d", apiPortInNode), u.Host); err != nil {
		return c, err
	}
	if _, err := c.Forward(u.Host); err != nil {
		return c, err
	}
	if err := os.WriteFile(filepath.Join(dir, "net-ready"), nil, 0o644); err != nil {
		return c, err
	}
	if err := waitFile(ctx, c.node, filepath.Join(dir, "containerd.sock")); err != nil {
		return c, fmt.Errorf("containerd: %w", err)
	}
	// The sandbox image, before the kubelet starts.
	pause, err := BuildImage(ctx, t, "pause", "./internal/testenv/clusterenv/testdata/pause")
	if err != nil {
		return c, err
	}
	if err := c.ImportImage(ctx, pause, "gdr.local/pause"); err != nil {
		return c, err
	}
	if err := os.WriteFile(filepath.Join(dir, "kubelet-go"), nil, 0o644); err != nil {
		return c, err
	}
	if err := c.waitNodeReady(ctx); err != nil {
		return c, err
	}
	return c, nil
}

// LockFile is the file that serializes clusters on one machine
// ($TMPDIR/gdr-clusterenv.lock): the kubelet's sysctls are machine-wide, so
// a second node would record the first one's values and restore them. Start
// holds an exclusive flock on it until Stop (and, if the test binary dies,
// until its watchdog has restored the sysctls).
func LockFile() string { return filepath.Join(os.TempDir(), "gdr-clusterenv.lock") }

// lockMachine waits for the exclusive lock on LockFile.
func lockMachine(ctx context.Context) (*os.File, error) {
	path := LockFile()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s (another cluster runs on this machine): %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// startControl starts a control-plane component on the machine.
func (c *Cluster) startControl(t testing.TB, name, bin string, args ...string) error {
	logf, err := os.Create(filepath.Join(c.Dir, name+".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	p, err := testenv.StartProcess(cmd)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

// makeCgroups creates the cgroupRoot in every cgroup hierarchy mounted
// under /sys/fs/cgroup.
func (c *Cluster) makeCgroups() error {
	ents, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		d := filepath.Join("/sys/fs/cgroup", e.Name(), c.cgroupDir)
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		if e.Name() == "cpuset" { // a new v1 cpuset has no CPUs or memory nodes
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuset", f))
				if err == nil {
					err = os.WriteFile(filepath.Join(d, f), v, 0o644)
				}
				if err != nil {
					return fmt.Errorf("cgroup %s/%s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// removeCgroups removes the cgroupRoot and everything under it, deepest
// first, retrying while the last processes leave.
func (c *Cluster) removeCgroups() error {
	ents, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		root := filepath.Join("/sys/fs/cgroup", e.Name(), c.cgroupDir)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for range 50 {
				if err = unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// writeNodeConfig writes containerd's, the CNI's and the kubelet's
// configuration and the node's init script.
func (c *Cluster) writeNodeConfig() error {
	d := c.Dir
	for _, sub := range []string{"containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			return err
		}
	}
	// containerd 2's configuration (version 3). The cgroup v1 deprecation is
	// the machine's (a hybrid hierarchy), not the node's to fix: ignored,
	// so that the CRI's conditions stay clean.
	containerd := fmt.Sprintf(`version = 3
root = %q
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %q
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  ignore_deprecation_warnings = ["io.containerd.deprecation/cgroup-v1"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q
`, filepath.Join(d, "containerd", "root"), filepath.Join(d, "containerd.sock"), filepath.Join(d, "containerd", "opt"),
		PauseImage, c.registryHostsDir(), filepath.Join(c.nodeBin, "bin", "runc"), filepath.Join(c.nodeBin, "cni"), filepath.Join(d, "cni", "net.d"))
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "gdr",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}
  }]
}
`, filepath.Join(d, "cni", "ipam"))
	// The kubelet listens on every address of the node's own network
	// namespace: the node's (the API server, through the veth) and
	// 127.0.0.1 (the SPIRE agent's k8s workload attestor, host network).
	// imagePullCredentialsVerificationPolicy NeverVerify: the kubelet of a
	// cluster without Kubernetes' ensure-secret-pulled-images (KEP-2535; on
	// by default here, v1.37): an image on the node runs for any Pod that
	// does not pull it, whoever's credentials pulled it. The tests show the
	// pools' images.pullPolicy closing that on such a node. userNamespaces:
	// a Pod with hostUsers: false gets IDsPerPod IDs.
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: %s
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
resolvConf: ""
clusterDomain: cluster.local
protectKernelDefaults: false
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
imagePullCredentialsVerificationPolicy: NeverVerify
userNamespaces:
  idsPerPod: %d
`, c.cgroupDir, filepath.Join(d, "containerd.sock"), filepath.Join(d, "pod-logs"), IDsPerPod)
	// kube-proxy, nftables mode (nft from the kube-node peer, on PATH): it
	// programs the node's own network namespace only. Every conntrack
	// setting 0: leave the kernel's (machine-wide ones among them) alone.
	kubeProxy := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: 10.244.0.0/24
hostnameOverride: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection:
  kubeconfig: %s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`, NodeName, filepath.Join(d, "node.kubeconfig"))
	bin := filepath.Join(c.nodeBin, "bin")
	// In the node's namespaces: /proc is its own (--mount-proc), so the
	// net.* sysctls below are the node's network namespace's. Forwarding:
	// a Service's traffic between two Pods is routed through the node;
	// bridge-nf-call-iptables: that traffic, bridged on cni0, passes
	// kube-proxy's rules (hairpin and Pod-to-Pod through a ClusterIP).
	script := fmt.Sprintf(`set -eu
D=%q
B=%q
K=%q
export PATH="$B:$PATH"
mount -t tmpfs -o mode=0755 gdr-node-run /run
mount -t tmpfs -o mode=0755 gdr-node-varlib /var/lib
ip link set lo up
# /dev/net/tun as a distribution's node has it (udev's rule: 0666); this machine has
# no udev (0600): a node of the same device, bound over it in this mount namespace.
if [ -c /dev/net/tun ]; then mknod -m 0666 "$D/tun" c 10 200 && mount --bind "$D/tun" /dev/net/tun; fi
echo 1 >/proc/sys/net/ipv4/ip_forward
echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
: >"$D/ns-ready"
while [ ! -e "$D/net-ready" ]; do sleep 0.1; done
"$B/containerd" --config "$D/containerd.toml" >"$D/containerd.log" 2>&1 &
while [ ! -e "$D/kubelet-go" ]; do sleep 0.1; done
"$K/kubelet" --config "$D/kubelet.yaml" --kubeconfig "$D/node.kubeconfig" --root-dir "$D/kubelet" \
  --hostname-override %s --node-ip %s >"$D/kubelet.log" 2>&1 &
"$K/kube-proxy" --config "$D/kube-proxy.yaml" >"$D/kube-proxy.log" 2>&1 &
wait
`, d, bin, c.kubeBin, NodeName, c.nodeIP)
	for name, data := range map[string]string{
		"containerd.toml": containerd, "cni/net.d/10-gdr.conflist": cni, "kubelet.yaml": kubelet, "node.sh": script,
		"kube-proxy.yaml": kubeProxy,
	} {
		if err := os.WriteFile(filepath.Join(d, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// startNode starts the node's init in new mount, network and PID
// namespaces. --kill-child: if unshare dies (the parent-death signal of
// testenv.StartProcess), the init is killed, and with it the namespace.
func (c *Cluster) startNode(ctx context.Context) error {
	logf, err := os.Create(filepath.Join(c.Dir, "node.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("unshare", "--mount", "--net", "--pid", "--fork", "--kill-child",
		"--propagation", "private", "--mount-proc", "/bin/sh", filepath.Join(c.Dir, "node.sh"))
	cmd.Stdout, cmd.Stderr = logf, logf
	c.node, err = testenv.StartProcess(cmd)
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
			var child int
			_, err := fmt.Sscan(f[0], &child)
			return child, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0, fmt.Errorf("unshare (pid %d) has no child", pid)
}

// waitFile waits for path to exist while p runs.
func waitFile(ctx context.Context, p *testenv.Process, path string) error {
	return p.WaitReady(ctx, 100*time.Millisecond, func(context.Context) error {
		_, err := os.Stat(path)
		return err
	})
}

// Forward makes a server of the machine's, listening at hostAddr
// (127.0.0.1:<port>), reachable from the node and its Pods at the returned
// address: the node's address and the same port, in the node's network
// namespace (nothing listens beyond 127.0.0.1 on the machine). The harness
// forwards each connection until Stop. Pods reach it directly, or through a
// Service without a selector whose EndpointSlice names that address
// (kube-proxy translates the ClusterIP), as they would reach a server
// outside the cluster.
func (c *Cluster) Forward(hostAddr string) (string, error) {
	_, port, err := net.SplitHostPort(hostAddr)
	if err != nil {
		return "", fmt.Errorf("clusterenv: forward %s: %w", hostAddr, err)
	}
	inNode := net.JoinHostPort(c.nodeIP, port)
	if err := c.forward(inNode, hostAddr); err != nil {
		return "", err
	}
	return inNode, nil
}

// NodeIP is the node's address (its InternalIP), where Forward listens.
func (c *Cluster) NodeIP() string { return c.nodeIP }

// forward listens on addr in the node's network namespace and forwards
// every connection to target on the machine.
func (c *Cluster) forward(addr, target string) error {
	l, err := netns.Listen(netns.Path(c.nodePID), addr)
	if err != nil {
		return err
	}
	c.proxyMu.Lock()
	c.proxies = append(c.proxies, l)
	c.proxyMu.Unlock()
	go netns.Proxy(l, func() (net.Conn, error) { return net.DialTimeout("tcp", target, 10*time.Second) })
	return nil
}

// writeKubeconfig writes a kubeconfig for cfg (a cluster admin), with its
// server replaced by server unless it is "".
func writeKubeconfig(path string, cfg *rest.Config, server string) error {
	if server == "" {
		server = cfg.Host
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return nil
}

// waitNodeReady waits until the node is registered and Ready, or the
// kubelet ended (its log's "command failed" line: a configuration the
// kubelet refuses), which it says at once rather than at ctx's end.
func (c *Cluster) waitNodeReady(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.Plane.RESTConfig())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var last string
	err = c.node.WaitReady(ctx, time.Second, func(ctx context.Context) error {
		if log, err := os.ReadFile(filepath.Join(c.Dir, "kubelet.log")); err == nil {
			for _, line := range strings.Split(string(log), "\n") {
				if strings.Contains(line, `"command failed"`) {
					cancel(fmt.Errorf("the kubelet ended: %s", line))
				}
			}
		}
		n, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s: %s", cond.Status, cond.Message)
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		return errors.New("node not ready: " + last)
	})
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	if err != nil {
		return fmt.Errorf("node %s: %w", NodeName, err)
	}
	return nil
}

// BuildImage builds the static Go main package pkg (relative to the module
// root) into an OCI layout named name, in a temporary folder, and returns
// the layout's folder.
func BuildImage(ctx context.Context, t testing.TB, name, pkg string) (string, error) {
	t.Helper()
	module, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := t.TempDir()
	_, err = imagebuild.Build(ctx, imagebuild.Options{
		Module: module, Out: out, Epoch: time.Unix(0, 0),
		// No Debian packages needed: these test images make no TLS calls.
		CABundle: []byte("# clusterenv test image: no CA certificates\n"),
	}, []imagebuild.Image{{Name: name, Package: pkg, Binary: name}})
	if err != nil {
		return "", fmt.Errorf("build image %s: %w", name, err)
	}
	return filepath.Join(out, name), nil
}

// moduleRoot is the folder of the go.mod above the working directory.
func moduleRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("no go.mod above the working directory")
		}
		d = parent
	}
}

// registryHostsDir is containerd's registry hosts directory (config_path):
// one folder per registry host, read at every pull.
func (c *Cluster) registryHostsDir() string { return filepath.Join(c.Dir, "containerd", "certs.d") }

// TrustPlainHTTPRegistry tells the node's containerd that the registry at
// host (host:port, as the node reaches it) speaks plain HTTP, for pulls by
// the kubelet (a test's registryenv behind Forward). Nothing else changes:
// credentials still come from each Pod's imagePullSecrets.
func (c *Cluster) TrustPlainHTTPRegistry(host string) error {
	dir := filepath.Join(c.registryHostsDir(), host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	conf := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+host, "http://"+host)
	return os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(conf), 0o644)
}

// TrustRegistryCA makes the node's containerd pull from host (host:port) over HTTPS, verifying
// its certificate with the CA of the PEM file caFile (a private registry's own CA).
func (c *Cluster) TrustRegistryCA(host, caFile string) error {
	dir := filepath.Join(c.registryHostsDir(), host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o644); err != nil {
		return err
	}
	conf := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = %q\n",
		"https://"+host, "https://"+host, filepath.Join(dir, "ca.crt"))
	return os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(conf), 0o644)
}

// ImportImage imports the OCI layout at dir into the node's containerd (the
// CRI's namespace k8s.io) as <repo>:latest, for linux/amd64.
func (c *Cluster) ImportImage(ctx context.Context, dir, repo string) error {
	tarPath := dir + ".tar"
	if err := tarDir(dir, tarPath); err != nil {
		return err
	}
	defer os.Remove(tarPath)
	out, err := exec.CommandContext(ctx, filepath.Join(c.nodeBin, "bin", "ctr"), "--address", filepath.Join(c.Dir, "containerd.sock"),
		"-n", "k8s.io", "images", "import", "--base-name", repo, "--platform", "linux/amd64", tarPath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s as %s: %w: %s", dir, repo, err, out)
	}
	return nil
}

// tarDir writes the files under dir into a tar archive at path, named
// relative to dir.
func tarDir(dir, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		return fmt.Errorf("tar %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// WaitServiceAccount waits until the controller-manager has created the
// "default" ServiceAccount of namespace ns (Pods are refused before).
func (c *Cluster) WaitServiceAccount(ctx context.Context, t testing.TB, ns string) {
	t.Helper()
	cs := c.Client(t)
	for {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("clusterenv: no default ServiceAccount in %s: %v", ns, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Client returns a cluster-admin clientset.
func (c *Cluster) Client(t testing.TB) kubernetes.Interface { return c.Plane.Client(t) }

// Stop tears the cluster down (see the package doc); calling it again
// returns the first call's error.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		var errs []error
		if c.node != nil {
			c.node.Stop(10 * time.Second) // unshare, then its init: the PID namespace ends
			if c.nodePID > 0 {
				for range 100 { // the namespace's init, reaped by unshare
					if _, err := os.Stat(fmt.Sprintf("/proc/%d", c.nodePID)); err != nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
		c.proxyMu.Lock()
		for _, l := range c.proxies {
			_ = l.Close()
		}
		c.proxies = nil
		c.proxyMu.Unlock()
		for _, p := range c.procs {
			p.Stop(10 * time.Second)
		}
		if err := exec.Command("ip", "link", "del", c.hostIf).Run(); err == nil {
			c.log("clusterenv: removed %s (the kernel destroys it with the node's network namespace, asynchronously: it was not gone yet)", c.hostIf)
		}
		if c.cgroupDir != "" {
			if err := c.removeCgroups(); err != nil {
				errs = append(errs, err)
			}
		}
		for s, v := range c.sysctls {
			if err := os.WriteFile(filepath.Join("/proc/sys", s), []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", s, v, err))
			}
		}
		if c.Plane != nil {
			if err := c.Plane.Stop(); err != nil {
				errs = append(errs, err)
			}
		}
		if os.Getenv("GDR_KEEP_CLUSTER_DIR") == "" {
			if err := os.RemoveAll(c.Dir); err != nil {
				errs = append(errs, err)
			}
		} else {
			c.log("clusterenv: kept %s", c.Dir)
		}
		if c.watchdog != nil {
			c.watchdog.release()
		}
		if c.lock != nil {
			_ = c.lock.Close()
		}
		if len(errs) > 0 {
			c.stopErr = fmt.Errorf("clusterenv: stop: %w", errors.Join(errs...))
		}
	})
	return c.stopErr
}

// dumpLogs logs the tail of every component's log.
func (c *Cluster) dumpLogs(t testing.TB) {
	t.Helper()
	for _, name := range []string{"node", "containerd", "kubelet", "kube-proxy", "kube-router", "kube-scheduler", "kube-controller-manager"} {
		t.Logf("--- %s.log (tail)\n%s", name, testenv.LogTail(filepath.Join(c.Dir, name+".log"), 40))
	}
}

// DumpLogs logs the tail of every component's log (for a failing test).
func (c *Cluster) DumpLogs(t testing.TB) { c.dumpLogs(t) }

// PodCPU returns the CPU time each Pod of the node has used so far, by Pod UID: its pod cgroup's
// cpuacct.usage, which includes its containers', for the Pods that have a cgroup now (the
// kubelet removes a finished Pod's soon after it ends, so a caller that wants a short Pod's total
// polls and keeps the largest reading).
func (c *Cluster) PodCPU() (map[string]time.Duration, error) {
	root := filepath.Join("/sys/fs/cgroup", "cpuacct", c.cgroupDir)
	out := map[string]time.Duration{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while we walked
			}
			return err
		}
		if !d.IsDir() || !strings.HasPrefix(d.Name(), "pod") {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cpuacct.usage"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fs.SkipDir
			}
			return err
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return fmt.Errorf("%s/cpuacct.usage: %w", p, err)
		}
		out[strings.TrimPrefix(d.Name(), "pod")] = time.Duration(ns)
		return fs.SkipDir // its containers are in it
	})
	return out, err
}
