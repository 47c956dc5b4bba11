package clusterenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// KubeRouterVersion is the release of kube-router whose network policy
// controller is the node's NetworkPolicy dataplane (StartNetworkPolicy).
const KubeRouterVersion = "v2.1.0"

// KubeRouterAssets returns the folder of scripts/peers/kube-router.sh's
// build (skipping or failing the test as testenv.RequirePeer does):
// kube-router and the iptables and ipset commands it runs.
func KubeRouterAssets(t testing.TB) string {
	t.Helper()
	return testenv.RequirePeer(t, testenv.Peer{Name: "kube-router", Version: KubeRouterVersion, Executables: []string{
		"kube-router", "bin/iptables", "bin/iptables-save", "bin/iptables-restore", "bin/ipset",
	}})
}

// NetworkPolicy is the cluster's NetworkPolicy dataplane: on every node,
// kube-router's network policy controller (its firewall only: no routing,
// no service proxy), running in that node's mount, network and PID
// namespaces and programming that node's own filter table (iptables,
// legacy backend) and ipsets. Every Pod is then isolated as the
// NetworkPolicies of the API server say, by the kube-router of its node
// (its ingress and its egress alike, whichever node the peer is on), and
// stays so until the cluster stops.
type NetworkPolicy struct {
	c     *Cluster
	bin   string             // the kube-router peer folder
	procs []*testenv.Process // one per node, in the order of c.nodes
}

// StartNetworkPolicy starts the NetworkPolicy dataplane on every node and
// waits until each has hooked its chains into its node's filter table
// (INPUT, FORWARD and OUTPUT jump to KUBE-ROUTER-*). A test that needs a
// policy enforced must still wait for that policy's rules
// (WaitPodPolicies): the controllers program them asynchronously.
//
// It is a test peer only (docs/CLUSTER.md). Each runs as a child of
// nsenter in its node's PID namespace, so it dies with the node (Stop, or
// the test binary's death), and Stop then ends its nsenter. Nothing outside
// the nodes' namespaces is changed: the machine's own firewall has no rule
// of it.
func (c *Cluster) StartNetworkPolicy(ctx context.Context, t testing.TB) *NetworkPolicy {
	t.Helper()
	dir := KubeRouterAssets(t)
	np := &NetworkPolicy{c: c, bin: dir}
	for _, n := range c.nodes {
		logf, err := os.Create(filepath.Join(n.dir, "kube-router.log"))
		if err != nil {
			t.Fatalf("clusterenv: kube-router log: %v", err)
		}
		// The service range is kube-apiserver's default (10.0.0.0/24: the
		// "kubernetes" Service is 10.0.0.1); no metrics, no health server.
		cmd := exec.Command("nsenter", "--target", fmt.Sprint(n.pid), "--mount", "--net", "--pid", "--",
			filepath.Join(dir, "kube-router"),
			"--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--run-loadbalancer=false",
			"--enable-ipv4=true", "--enable-ipv6=false", "--enable-cni=false",
			"--kubeconfig="+filepath.Join(c.Dir, "node.kubeconfig"), "--hostname-override="+n.name,
			"--service-cluster-ip-range=10.0.0.0/24", "--metrics-port=0", "--health-port=0",
			"--iptables-sync-period=1m", "-v=1")
		cmd.Env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"))
		cmd.Stdout, cmd.Stderr = logf, logf
		p, err := testenv.StartProcess(cmd)
		logf.Close()
		if err != nil {
			t.Fatalf("clusterenv: start kube-router on %s: %v", n.name, err)
		}
		c.procs = append(c.procs, p)
		np.procs = append(np.procs, p)
	}
	for i, n := range c.nodes {
		err := np.procs[i].WaitReady(ctx, 200*time.Millisecond, func(ctx context.Context) error {
			rules, err := np.FilterRules(ctx, n.name)
			if err != nil {
				return err
			}
			for _, hook := range []string{"INPUT", "FORWARD", "OUTPUT"} {
				if !hooked(rules, hook) {
					return fmt.Errorf("%s does not jump to KUBE-ROUTER-%s yet", hook, hook)
				}
			}
			return nil
		})
		if err != nil {
			t.Logf("--- %s: kube-router.log (tail)\n%s", n.name, testenv.LogTail(filepath.Join(n.dir, "kube-router.log"), 40))
			t.Fatalf("clusterenv: kube-router on %s: %v", n.name, err)
		}
	}
	return np
}

// hooked reports whether the filter table dump rules has chain jump to
// KUBE-ROUTER-<chain>.
func hooked(rules, chain string) bool {
	for _, l := range strings.Split(rules, "\n") {
		if strings.HasPrefix(l, "-A "+chain+" ") && strings.HasSuffix(l, "-j KUBE-ROUTER-"+chain) {
			return true
		}
	}
	return false
}

// FilterRules returns the filter table of the node nodeName as
// iptables-save prints it.
func (np *NetworkPolicy) FilterRules(ctx context.Context, nodeName string) (string, error) {
	var n *node
	for _, m := range np.c.nodes {
		if m.name == nodeName {
			n = m
		}
	}
	if n == nil {
		return "", fmt.Errorf("clusterenv: no node %q", nodeName)
	}
	out, err := exec.CommandContext(ctx, "nsenter", "--target", fmt.Sprint(n.pid), "--mount", "--net", "--",
		filepath.Join(np.bin, "bin", "iptables-save"), "-t", "filter").Output()
	if err != nil {
		return "", fmt.Errorf("iptables-save -t filter in node %s's namespace: %w", nodeName, err)
	}
	return string(out), nil
}

// podJump matches kube-router's jump from its FORWARD chain into a Pod's
// firewall chain for the Pod's own traffic: name, namespace, chain.
var podJump = regexp.MustCompile(`^-A KUBE-ROUTER-\S+ .*--comment "rule to jump traffic from POD name:(\S+) namespace: (\S+) to chain (\S+)" -j (\S+)$`)

// policyJump matches a jump from a Pod's firewall chain into a policy's.
var policyJump = regexp.MustCompile(`^-A (\S+) .*--comment "run through nw policy (\S+)"`)

// PodPolicies returns the names of the NetworkPolicies whose rules
// kube-router has programmed for the Pod namespace/name (sorted), and
// whether it has a firewall chain at all: a Pod with a chain and no policy
// runs through kube-router's default chain (everything allowed). The rules
// are those of the Pod's node (its kube-router makes chains for the Pods
// of its node only).
func (np *NetworkPolicy) PodPolicies(ctx context.Context, namespace, name string) (policies []string, hasChain bool, err error) {
	chain, lines := "", []string(nil)
	for _, n := range np.c.nodes {
		rules, err := np.FilterRules(ctx, n.name)
		if err != nil {
			return nil, false, err
		}
		for _, l := range strings.Split(rules, "\n") {
			if m := podJump.FindStringSubmatch(l); m != nil && m[1] == name && m[2] == namespace {
				chain = m[3]
			}
		}
		if chain != "" {
			lines = strings.Split(rules, "\n")
			break
		}
	}
	if chain == "" {
		return nil, false, nil
	}
	for _, l := range lines {
		if m := policyJump.FindStringSubmatch(l); m != nil && m[1] == chain && !slices.Contains(policies, m[2]) {
			policies = append(policies, m[2])
		}
	}
	slices.Sort(policies)
	return policies, true, nil
}

// WaitPodPolicies waits until kube-router's rules for the Pod
// namespace/name run through exactly the policies want (none: the Pod has a
// firewall chain and no policy), and returns when that was first seen.
func (np *NetworkPolicy) WaitPodPolicies(ctx context.Context, t testing.TB, namespace, name string, want []string, timeout time.Duration) time.Time {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	var last string
	for deadline := time.Now().Add(timeout); ; time.Sleep(250 * time.Millisecond) {
		got, ok, err := np.PodPolicies(ctx, namespace, name)
		switch {
		case err != nil:
			last = err.Error()
		case !ok:
			last = "no firewall chain for the Pod"
		case slices.Equal(got, want):
			return time.Now()
		default:
			last = fmt.Sprintf("policies %v", got)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			for _, n := range np.c.nodes {
				t.Logf("--- %s: kube-router.log (tail)\n%s", n.name, testenv.LogTail(filepath.Join(n.dir, "kube-router.log"), 40))
			}
			t.Fatalf("clusterenv: kube-router's rules for Pod %s/%s: %s after %v, want policies %v", namespace, name, last, timeout, want)
		}
	}
}
