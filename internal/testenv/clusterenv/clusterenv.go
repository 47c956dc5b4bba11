// Package clusterenv runs a real Kubernetes cluster for end-to-end tests:
// the control plane of kubeenv (kube-apiserver + etcd), kube-scheduler,
// kube-controller-manager, and one node (Start) or more (StartWith,
// Options.Nodes): each containerd (with runc and the CNI plugins), a kubelet
// and kube-proxy, all v1.37.2. The nodes are NodeName (gdr-node), then
// gdr-node-2, gdr-node-3, ... (NodeNames).
//
// The binaries are built once, outside the checkout, by `make peers`:
// scripts/peers/kube.sh (API server, etcd) and scripts/peers/kube-node.sh
// (scheduler, controller-manager, kubelet from the Go module proxy;
// containerd 2.4 and runc 1.5 built from the Go module proxy, which offer
// Kubernetes user namespaces; the CNI plugins from Debian's packages). Start
// skips the test on a developer machine without them and fails it with
// CI=true (testenv.RequirePeer).
//
// What Start and StartWith guarantee:
//   - Each node runs in private mount, network and PID namespaces of its
//     own (unshare from util-linux). Inside, /run and /var/lib are fresh
//     tmpfs mounts (the kubelet and containerd write fixed paths there:
//     /var/lib/kubelet/device-plugins, /var/lib/cni, /run/containerd), so
//     nothing a node writes reaches the machine's own /run or /var/lib, nor
//     another node's, and every mount a node makes (overlay root
//     filesystems, Pod network namespaces) lives and dies with its mount
//     namespace. The first node's files are in Dir, every other node's in
//     Dir/<node name>.
//   - Every server listens on 127.0.0.1 of the machine, or inside a node's
//     own network namespace: each kubelet on its node's address, which the
//     API server reaches through that node's veth pair (host side: node i's
//     /30 is 10.254.<slot>.<4i>, on an interface named gdrh<hex> for the
//     first node, gdrh<hex>n<i> for node i; removed by Stop); each node's kubelet,
//     kube-proxy and kube-router reach the API server through a proxy the
//     harness listens with on 127.0.0.1:6443 inside that node's namespace.
//   - ServiceAccount admission is on (kubeenv turns it off): every Pod gets
//     a projected token, signed by the API server. A Pod created right after
//     its namespace may be refused until the controller-manager has made the
//     namespace's "default" ServiceAccount (WaitServiceAccount).
//   - Pods get addresses from a CNI bridge (cni0, host-local IPAM) inside
//     their node's namespace: 10.244.<i>.0/24 on node i (from 0), so
//     10.244.0.0/24 on the first; kube-proxy's clusterCIDR is 10.244.0.0/16.
//   - Between nodes, traffic never crosses the machine's network namespace:
//     every two nodes are joined by a veth pair of their own (gdrn<j> in
//     node i's namespace is its link to node j, from 1), each end carrying
//     its node's address, with routes to the other node's address and Pod
//     range. Pods reach Pods of another node, and Services whose endpoints
//     are there, without NAT; the other nodes' Pods and processes reach the
//     first node's address (Forward's listeners, the "kubernetes" Service's
//     endpoint) over their link to it. The machine's forwarding, sysctls and
//     firewall are not touched: each node enables forwarding in its own
//     network namespace.
//   - Each node's kubelet has a cgroupRoot of its own (/<node name>-<hex>
//     in every cgroup hierarchy), removed by Stop.
//   - At most GDR_TEST_CLUSTERS clusters at once per machine (ClustersEnv,
//     default DefaultClusters), across test processes: StartWith waits for
//     a free slot, held until Stop; the slot names the cluster's addresses.
//   - The kubelets change kernel sysctls that are not namespaced
//     (vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
//     kernel.panic_on_oops, kernel.keys.root_maxkeys,
//     kernel.keys.root_maxbytes): the first cluster to start records them,
//     before its first node starts, and the last one to stop restores them,
//     after its last node ended (machine).
//   - Stop (also registered with t.Cleanup) kills every node's PID
//     namespace (every process of the node, containers and shims included,
//     dies with it), stops the scheduler, controller-manager and control
//     plane, removes every node's veth to the machine, every node's cgroups
//     and the data folder, and (as the last) restores the sysctls. If the test binary dies
//     first, the kernel kills each unshare (parent-death signal), which
//     kills its namespace's init, which ends the whole namespace; the veths
//     go with the namespaces (the links between nodes never were the
//     machine's); a watchdog process then removes every node's cgroups and
//     the folder and restores the sysctls.
//
// Every per-node operation covers every node: ImportImage,
// TrustPlainHTTPRegistry and TrustRegistryCA (each node's containerd),
// StartNetworkPolicy (kube-router on each node), StartSPIREAgent (an agent
// Pod on each node), PodCPU and DumpLogs. Forward listens on the first
// node only, which every node reaches.
//
// No registry is reachable: images are built locally (internal/imagebuild)
// and imported into containerd (Cluster.ImportImage); Pods must use
// imagePullPolicy Never or IfNotPresent. The sandbox ("pause") image is
// built from ./testdata/pause and imported by StartWith.
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

// NodeName is the name the first node registers with (the only one of
// Start's cluster).
const NodeName = "gdr-node"

// PauseImage is the sandbox image Start imports and containerd uses.
const PauseImage = "gdr.local/pause:latest"

// apiPortInNode is where the kubelet finds the API server, on 127.0.0.1 of
// the node's network namespace (the harness's proxy).
const apiPortInNode = 6443

// podRange holds every node's Pod range (node i: 10.244.<i>.0/24):
// kube-proxy's clusterCIDR.
const podRange = "10.244.0.0/16"

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

// Options are what StartWith varies; the zero value is Start's.
type Options struct {
	// Nodes is the number of nodes, 1 to MaxNodes (0: one). The first is
	// NodeName, the others NodeName-2, NodeName-3, ...
	Nodes int
}

// MaxNodes is the most nodes a cluster has (Options.Nodes).
const MaxNodes = 8

// Cluster is one running cluster.
type Cluster struct {
	// Plane is the control plane (kube-apiserver + etcd).
	Plane *kubeenv.Plane
	// Dir holds every file of the cluster's own: configs, logs, data (the
	// first node's in Dir itself, every other node's in Dir/<node name>).
	Dir string

	nodeBin  string // kube-node peer folder: the runtime
	kubeBin  string // kube peer folder: the Kubernetes commands
	id       string // hex, names the cgroupRoots and the host veths
	nodes    []*node
	procs    []*testenv.Process
	proxyMu  sync.Mutex
	proxies  []net.Listener // in the nodes' namespaces: the API server's, Forward's
	watchdog *watchdog
	hold     *hold // its slot and share of the machine (sysctls are global)
	restored bool  // Stop restored the sysctls: no other cluster ran
	stopOnce sync.Once
	stopErr  error
	log      func(format string, args ...any)
}

// node is one node of the cluster: its namespaces, addresses and folders.
type node struct {
	name      string
	index     int              // from 0: the order of NodeNames
	dir       string           // the cluster's Dir for the first node, Dir/<name> for the others
	ip        string           // its InternalIP: .2 of its /30 (eth0 in its namespace)
	hostIP    string           // .1 of its /30: the machine's side of its veth
	hostIf    string           // the machine's side of its veth
	podCIDR   string           // its CNI bridge's range
	cgroupDir string           // "/<name>-<id>": its kubelet's cgroupRoot
	proc      *testenv.Process // unshare
	pid       int              // the namespace's init, as the machine sees it
}

// nodeName is the name of the i-th node (from 0).
func nodeName(i int) string {
	if i == 0 {
		return NodeName
	}
	return fmt.Sprintf("%s-%d", NodeName, i+1)
}

// Start starts a one-node cluster (StartWith with the zero Options).
func Start(ctx context.Context, t testing.TB) *Cluster {
	t.Helper()
	return StartWith(ctx, t, Options{})
}

// StartWith starts the whole cluster and waits until every node is Ready.
// It registers Stop with t.Cleanup. Needs root (namespaces, cgroups,
// sysctls).
func StartWith(ctx context.Context, t testing.TB, o Options) *Cluster {
	t.Helper()
	kubeDir := KubeAssets(t)
	nodeDir := NodeAssets(t)
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "clusterenv: the node needs root (namespaces, cgroups, sysctls)")
	}
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Nodes < 1 || o.Nodes > MaxNodes {
		t.Fatalf("clusterenv: Options.Nodes %d: want 1 to %d", o.Nodes, MaxNodes)
	}
	c, err := start(ctx, t, kubeDir, nodeDir, o)
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

func start(ctx context.Context, t testing.TB, kubeDir, nodeDir string, o Options) (*Cluster, error) {
	m, err := clustersOnMachine()
	if err != nil {
		return nil, err
	}
	// A slot first (Reserve's, or the next free one): it names the
	// addresses, so no two clusters share one.
	h := reserved(ctx)
	if h == nil {
		if h, err = m.takeSlot(ctx); err != nil {
			return nil, err
		}
	}
	if err := h.join(ctx); err != nil {
		h.slotF.Close()
		return nil, err
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "gdr-cluster-")
	if err != nil {
		_, _ = h.release(context.Background())
		return nil, err
	}
	c := &Cluster{Dir: dir, nodeBin: nodeDir, kubeBin: kubeDir, id: id, hold: h, log: t.Logf}
	// Node i's veth pair is the /30 10.254.<slot>.<4i>: .1 here, .2 the
	// node; its Pods, 10.244.<i>.0/24 (inside the nodes' namespaces: every
	// cluster has its own).
	for i := range o.Nodes {
		n := &node{
			name: nodeName(i), index: i, dir: dir, hostIf: "gdrh" + id,
			hostIP:  fmt.Sprintf("10.254.%d.%d", h.slot, 4*i+1),
			ip:      fmt.Sprintf("10.254.%d.%d", h.slot, 4*i+2),
			podCIDR: fmt.Sprintf("10.244.%d.0/24", i),
		}
		if i > 0 {
			n.dir = filepath.Join(dir, n.name)
			n.hostIf = fmt.Sprintf("gdrh%sn%d", id, i+1)
		}
		n.cgroupDir = "/" + n.name + "-" + id
		c.nodes = append(c.nodes, n)
	}
	first := c.nodes[0]

	// From here on the machine holds state of the nodes': the watchdog
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
			// The "kubernetes" Service's endpoint: the first node's address,
			// where the harness forwards to the API server (Pods reach it
			// through kube-proxy, as in-cluster clients do; the other nodes'
			// Pods over the link between the nodes).
			"advertise-address": {first.ip},
		},
		ServingIPs: []net.IP{net.ParseIP(first.ip)},
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

	// Each node: its own cgroupRoot in every hierarchy, its configuration,
	// its namespaces.
	for _, n := range c.nodes {
		if err := c.makeCgroups(n); err != nil {
			return c, err
		}
		if err := c.writeNodeConfig(n); err != nil {
			return c, err
		}
		if err := c.startNode(n); err != nil {
			return c, err
		}
	}
	for _, n := range c.nodes {
		if err := waitFile(ctx, n.proc, filepath.Join(n.dir, "ns-ready")); err != nil {
			return c, fmt.Errorf("node %s namespace: %w", n.name, err)
		}
		if n.pid, err = childPID(n.proc.PID()); err != nil {
			return c, fmt.Errorf("node %s: %w", n.name, err)
		}
		if err := hostLink(ctx, n); err != nil {
			return c, err
		}
	}
	for i, a := range c.nodes {
		for _, b := range c.nodes[i+1:] {
			if err := nodeLink(ctx, a, b); err != nil {
				return c, err
			}
		}
	}
	// The kubelet's, kube-proxy's (and kube-router's) way to the API
	// server: 127.0.0.1:6443 in each node's namespace; the Pods': the
	// "kubernetes" Service's endpoint, the first node's address and the API
	// server's port.
	u, err := url.Parse(c.Plane.Config.Host)
	if err != nil {
		return c, err
	}
	for _, n := range c.nodes {
		if err := c.forward(n, fmt.Sprintf("127.0.0.1:%d", apiPortInNode), u.Host); err != nil {
			return c, err
		}
	}
	if _, err := c.Forward(u.Host); err != nil {
		return c, err
	}
	for _, n := range c.nodes {
		if err := os.WriteFile(filepath.Join(n.dir, "net-ready"), nil, 0o644); err != nil {
			return c, err
		}
	}
	for _, n := range c.nodes {
		if err := waitFile(ctx, n.proc, filepath.Join(n.dir, "containerd.sock")); err != nil {
			return c, fmt.Errorf("node %s containerd: %w", n.name, err)
		}
	}
	// The sandbox image, before the kubelets start.
	pause, err := BuildImage(ctx, t, "pause", "./internal/testenv/clusterenv/testdata/pause")
	if err != nil {
		return c, err
	}
	if err := c.ImportImage(ctx, pause, "gdr.local/pause"); err != nil {
		return c, err
	}
	for _, n := range c.nodes {
		if err := os.WriteFile(filepath.Join(n.dir, "kubelet-go"), nil, 0o644); err != nil {
			return c, err
		}
	}
	for _, n := range c.nodes {
		if err := c.waitNodeReady(ctx, n); err != nil {
			return c, err
		}
	}
	return c, nil
}

// hostLink gives node n its veth pair to the machine: the machine's side
// (n.hostIf, n.hostIP/30) here, eth0 (n.ip/30, the default route) in the
// node's namespace. Only the API server (the kubelet's InternalIP) and the
// machine's own clients use it: the machine forwards nothing.
func hostLink(ctx context.Context, n *node) error {
	nsPID := fmt.Sprint(n.pid)
	for _, args := range [][]string{
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", "eth0", "netns", nsPID},
		{"addr", "add", n.hostIP + "/30", "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
	} {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return inNode(ctx, n, [][]string{
		{"addr", "add", n.ip + "/30", "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", n.hostIP},
	})
}

// linkName is the name, in every other node's namespace, of its link to n.
func linkName(n *node) string { return fmt.Sprintf("gdrn%d", n.index+1) }

// nodeLink joins nodes a and b with a veth pair made in a's namespace and
// moved into b's (it never exists in the machine's): each end carries its
// node's own address (/32) and routes the other node's address and Pod
// range to it. Pods then reach each other across the nodes without NAT, and
// b's Pods reach a's address (Forward's listeners, the API server's
// endpoint) through a's end.
func nodeLink(ctx context.Context, a, b *node) error {
	inA, inB := linkName(b), linkName(a)
	out, err := exec.CommandContext(ctx, "nsenter", "-t", fmt.Sprint(a.pid), "-n",
		"ip", "link", "add", inA, "type", "veth", "peer", "name", inB, "netns", fmt.Sprint(b.pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("link %s to %s: %w: %s", a.name, b.name, err, out)
	}
	for _, e := range []struct {
		self, peer *node
		dev        string
	}{{a, b, inA}, {b, a, inB}} {
		if err := inNode(ctx, e.self, [][]string{
			{"addr", "add", e.self.ip + "/32", "dev", e.dev},
			{"link", "set", e.dev, "up"},
			{"route", "add", e.peer.ip + "/32", "dev", e.dev, "src", e.self.ip},
			{"route", "add", e.peer.podCIDR, "via", e.peer.ip, "dev", e.dev, "src", e.self.ip},
		}); err != nil {
			return err
		}
	}
	return nil
}

// inNode runs ip with each of cmds in n's network namespace.
func inNode(ctx context.Context, n *node, cmds [][]string) error {
	for _, args := range cmds {
		full := append([]string{"-t", fmt.Sprint(n.pid), "-n", "ip"}, args...)
		if out, err := exec.CommandContext(ctx, "nsenter", full...).CombinedOutput(); err != nil {
			return fmt.Errorf("node %s: nsenter %s: %w: %s", n.name, strings.Join(full, " "), err, out)
		}
	}
	return nil
}

// NodeNames are the names of the nodes, the first (NodeName) first.
func (c *Cluster) NodeNames() []string {
	names := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		names[i] = n.name
	}
	return names
}

// NodeIPOf is the address (InternalIP) of the node name, or "" if the
// cluster has no such node.
func (c *Cluster) NodeIPOf(name string) string {
	for _, n := range c.nodes {
		if n.name == name {
			return n.ip
		}
	}
	return ""
}

// LockFile is the file every running cluster of the machine holds a shared
// flock on ($TMPDIR/gdr-clusterenv.lock; see machine): the last one to stop
// restores the kubelets' sysctls.
func LockFile() string { return machine{dir: os.TempDir()}.path("lock") }

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

// makeCgroups creates n's cgroupRoot in every cgroup hierarchy mounted
// under /sys/fs/cgroup.
func (c *Cluster) makeCgroups(n *node) error {
	ents, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		d := filepath.Join("/sys/fs/cgroup", e.Name(), n.cgroupDir)
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

// removeCgroups removes n's cgroupRoot and everything under it, deepest
// first, retrying while the last processes leave.
func (c *Cluster) removeCgroups(n *node) error {
	ents, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		root := filepath.Join("/sys/fs/cgroup", e.Name(), n.cgroupDir)
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

// writeNodeConfig writes n's containerd's, CNI's, kubelet's and
// kube-proxy's configuration and its init script, into n's folder.
func (c *Cluster) writeNodeConfig(n *node) error {
	d := n.dir
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
		PauseImage, n.registryHostsDir(), filepath.Join(c.nodeBin, "bin", "runc"), filepath.Join(c.nodeBin, "cni"), filepath.Join(d, "cni", "net.d"))
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "gdr",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}
  }]
}
`, n.podCIDR, filepath.Join(d, "cni", "ipam"))
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
`, n.cgroupDir, filepath.Join(d, "containerd.sock"), filepath.Join(d, "pod-logs"), IDsPerPod)
	// kube-proxy, nftables mode (nft from the kube-node peer, on PATH): it
	// programs the node's own network namespace only. Every conntrack
	// setting 0: leave the kernel's (machine-wide ones among them) alone.
	// clusterCIDR covers every node's Pod range: Pod-to-Service traffic
	// from any node's Pods is not masqueraded.
	kubeProxy := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: %s
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
`, podRange, n.name, filepath.Join(c.Dir, "node.kubeconfig"))
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
"$K/kubelet" --config "$D/kubelet.yaml" --kubeconfig %q --root-dir "$D/kubelet" \
  --hostname-override %s --node-ip %s >"$D/kubelet.log" 2>&1 &
"$K/kube-proxy" --config "$D/kube-proxy.yaml" >"$D/kube-proxy.log" 2>&1 &
wait
`, d, bin, c.kubeBin, filepath.Join(c.Dir, "node.kubeconfig"), n.name, n.ip)
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

// startNode starts n's init in new mount, network and PID namespaces.
// --kill-child: if unshare dies (the parent-death signal of
// testenv.StartProcess), the init is killed, and with it the namespace.
func (c *Cluster) startNode(n *node) error {
	logf, err := os.Create(filepath.Join(n.dir, "node.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("unshare", "--mount", "--net", "--pid", "--fork", "--kill-child",
		"--propagation", "private", "--mount-proc", "/bin/sh", filepath.Join(n.dir, "node.sh"))
	cmd.Stdout, cmd.Stderr = logf, logf
	n.proc, err = testenv.StartProcess(cmd)
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
// (127.0.0.1:<port>), reachable from every node and its Pods at the
// returned address: the first node's address (NodeIP) and the same port, in
// that node's network namespace (nothing listens beyond 127.0.0.1 on the
// machine); the other nodes reach that address over their links to the
// first. The harness forwards each connection until Stop. Pods reach it
// directly, or through a Service without a selector whose EndpointSlice
// names that address (kube-proxy translates the ClusterIP), as they would
// reach a server outside the cluster.
func (c *Cluster) Forward(hostAddr string) (string, error) {
	_, port, err := net.SplitHostPort(hostAddr)
	if err != nil {
		return "", fmt.Errorf("clusterenv: forward %s: %w", hostAddr, err)
	}
	inNode := net.JoinHostPort(c.nodes[0].ip, port)
	if err := c.forward(c.nodes[0], inNode, hostAddr); err != nil {
		return "", err
	}
	return inNode, nil
}

// NodeIP is the first node's address (its InternalIP), where Forward
// listens and the API server's "kubernetes" Service ends.
func (c *Cluster) NodeIP() string { return c.nodes[0].ip }

// forward listens on addr in n's network namespace and forwards every
// connection to target on the machine.
func (c *Cluster) forward(n *node, addr, target string) error {
	l, err := netns.Listen(netns.Path(n.pid), addr)
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

// waitNodeReady waits until n is registered and Ready, or its kubelet
// ended (its log's "command failed" line: a configuration the kubelet
// refuses), which it says at once rather than at ctx's end.
func (c *Cluster) waitNodeReady(ctx context.Context, n *node) error {
	cs, err := kubernetes.NewForConfig(c.Plane.RESTConfig())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var last string
	err = n.proc.WaitReady(ctx, time.Second, func(ctx context.Context) error {
		if log, err := os.ReadFile(filepath.Join(n.dir, "kubelet.log")); err == nil {
			for _, line := range strings.Split(string(log), "\n") {
				if strings.Contains(line, `"command failed"`) {
					cancel(fmt.Errorf("the kubelet ended: %s", line))
				}
			}
		}
		obj, err := cs.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return err
		}
		for _, cond := range obj.Status.Conditions {
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
		return fmt.Errorf("node %s: %w", n.name, err)
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

// registryHostsDir is n's containerd's registry hosts directory
// (config_path): one folder per registry host, read at every pull.
func (n *node) registryHostsDir() string { return filepath.Join(n.dir, "containerd", "certs.d") }

// TrustPlainHTTPRegistry tells every node's containerd that the registry at
// host (host:port, as the nodes reach it) speaks plain HTTP, for pulls by
// the kubelets (a test's registryenv behind Forward). Nothing else changes:
// credentials still come from each Pod's imagePullSecrets.
func (c *Cluster) TrustPlainHTTPRegistry(host string) error {
	conf := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+host, "http://"+host)
	for _, n := range c.nodes {
		dir := filepath.Join(n.registryHostsDir(), host)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(conf), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// TrustRegistryCA makes every node's containerd pull from host (host:port) over HTTPS,
// verifying its certificate with the CA of the PEM file caFile (a private registry's own CA).
func (c *Cluster) TrustRegistryCA(host, caFile string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	for _, n := range c.nodes {
		dir := filepath.Join(n.registryHostsDir(), host)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o644); err != nil {
			return err
		}
		conf := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = %q\n",
			"https://"+host, "https://"+host, filepath.Join(dir, "ca.crt"))
		if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(conf), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ImportImage imports the OCI layout at dir into every node's containerd
// (the CRI's namespace k8s.io) as <repo>:latest, for linux/amd64, the nodes
// at once. dir is only read: the archive it makes of it is the cluster's
// own (in Dir), since clusters side by side import the same layouts.
func (c *Cluster) ImportImage(ctx context.Context, dir, repo string) error {
	f, err := os.CreateTemp(c.Dir, "import-*.tar")
	if err != nil {
		return err
	}
	tarPath := f.Name()
	f.Close()
	if err := tarDir(dir, tarPath); err != nil {
		os.Remove(tarPath)
		return err
	}
	defer os.Remove(tarPath)
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() {
			out, err := exec.CommandContext(ctx, filepath.Join(c.nodeBin, "bin", "ctr"), "--address", filepath.Join(n.dir, "containerd.sock"),
				"-n", "k8s.io", "images", "import", "--base-name", repo, "--platform", "linux/amd64", tarPath).CombinedOutput()
			if err != nil {
				errs[i] = fmt.Errorf("ctr images import %s as %s on node %s: %w: %s", dir, repo, n.name, err, out)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
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
		var wg sync.WaitGroup
		for _, n := range c.nodes {
			if n.proc == nil {
				continue
			}
			wg.Go(func() {
				n.proc.Stop(10 * time.Second) // unshare, then its init: the PID namespace ends
				if n.pid > 0 {
					for range 100 { // the namespace's init, reaped by unshare
						if _, err := os.Stat(fmt.Sprintf("/proc/%d", n.pid)); err != nil {
							break
						}
						time.Sleep(100 * time.Millisecond)
					}
				}
			})
		}
		wg.Wait()
		c.proxyMu.Lock()
		for _, l := range c.proxies {
			_ = l.Close()
		}
		c.proxies = nil
		c.proxyMu.Unlock()
		for _, p := range c.procs {
			p.Stop(10 * time.Second)
		}
		for _, n := range c.nodes {
			if err := exec.Command("ip", "link", "del", n.hostIf).Run(); err == nil {
				c.log("clusterenv: removed %s (the kernel destroys it with the node's network namespace, asynchronously: it was not gone yet)", n.hostIf)
			}
			if err := c.removeCgroups(n); err != nil {
				errs = append(errs, err)
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
		if c.hold != nil {
			// After the watchdog, which holds the same flocks.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			restored, err := c.hold.release(ctx)
			cancel()
			c.restored = restored
			if err != nil {
				errs = append(errs, err)
			}
			if !restored {
				c.log("clusterenv: another cluster runs on this machine: the last one to stop restores the sysctls")
			}
		}
		if len(errs) > 0 {
			c.stopErr = fmt.Errorf("clusterenv: stop: %w", errors.Join(errs...))
		}
	})
	return c.stopErr
}

// dumpLogs logs the tail of every component's log, every node's.
func (c *Cluster) dumpLogs(t testing.TB) {
	t.Helper()
	for _, n := range c.nodes {
		for _, name := range []string{"node", "containerd", "kubelet", "kube-proxy", "kube-router"} {
			t.Logf("--- %s: %s.log (tail)\n%s", n.name, name, testenv.LogTail(filepath.Join(n.dir, name+".log"), 40))
		}
	}
	for _, name := range []string{"kube-scheduler", "kube-controller-manager"} {
		t.Logf("--- %s.log (tail)\n%s", name, testenv.LogTail(filepath.Join(c.Dir, name+".log"), 40))
	}
}

// DumpLogs logs the tail of every component's log (for a failing test).
func (c *Cluster) DumpLogs(t testing.TB) { c.dumpLogs(t) }

// PodCPU returns the CPU time each Pod of every node has used so far, by Pod UID: its pod
// cgroup's cpuacct.usage, which includes its containers', for the Pods that have a cgroup now
// (the kubelet removes a finished Pod's soon after it ends, so a caller that wants a short Pod's
// total polls and keeps the largest reading).
func (c *Cluster) PodCPU() (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, n := range c.nodes {
		if err := podCPU(filepath.Join("/sys/fs/cgroup", "cpuacct", n.cgroupDir), out); err != nil {
			return out, fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	return out, nil
}

// podCPU adds the cpuacct.usage of every pod cgroup under root to out.
func podCPU(root string, out map[string]time.Duration) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
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
}
