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

// NetworkPolicy is the node's NetworkPolicy dataplane: kube-router's
// network policy controller (its firewall only: no routing, no service
// proxy), running in the node's mount, network and PID namespaces and
// programming the node's own filter table (iptables, legacy backend) and
// ipsets. Every Pod on the node is then isolated as the NetworkPolicies of
// the API server say, and stays so until the node stops.
type NetworkPolicy struct {
	c   *Cluster
	bin string // the kube-router peer folder
	p   *testenv.Process
}

// StartNetworkPolicy starts the NetworkPolicy dataplane on the node and
// waits until it has hooked its chains into the node's filter table
// (INPUT, FORWARD and OUTPUT jump to KUBE-ROUTER-*). A test that needs a
// policy enforced must still wait for that policy's rules
// (WaitPodPolicies): the controller programs them asynchronously.
//
// It is a test peer only (docs/CLUSTER.md). It runs as a child of nsenter
// in the node's PID namespace, so it dies with the node (Stop, or the test
// binary's death), and Stop then ends its nsenter. Nothing outside the
// node's namespaces is changed: the machine's own firewall has no rule of
// it.
func (c *Cluster) StartNetworkPolicy(ctx context.Context, t testing.TB) *NetworkPolicy {
	t.Helper()
	dir := KubeRouterAssets(t)
	np := &NetworkPolicy{c: c, bin: dir}
	logPath := filepath.Join(c.Dir, "kube-router.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("clusterenv: kube-router log: %v", err)
	}
	defer logf.Close()
	// The service range is kube-apiserver's default (10.0.0.0/24: the
	// "kubernetes" Service is 10.0.0.1); no metrics, no health server.
	cmd := exec.Command("nsenter", "--target", fmt.Sprint(c.nodePID), "--mount", "--net", "--pid", "--",
		filepath.Join(dir, "kube-router"),
		"--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--run-loadbalancer=false",
		"--enable-ipv4=true", "--enable-ipv6=false", "--enable-cni=false",
		"--kubeconfig="+filepath.Join(c.Dir, "node.kubeconfig"), "--hostname-override="+NodeName,
		"--service-cluster-ip-range=10.0.0.0/24", "--metrics-port=0", "--health-port=0",
		"--iptables-sync-period=1m", "-v=1")
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if np.p, err = testenv.StartProcess(cmd); err != nil {
		t.Fatalf("clusterenv: start kube-router: %v", err)
	}
	c.procs = append(c.procs, np.p)
	err = np.p.WaitReady(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		rules, err := np.FilterRules(ctx)
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
		t.Logf("--- kube-router.log (tail)\n%s", testenv.LogTail(logPath, 40))
		t.Fatalf("clusterenv: kube-router: %v", err)
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

// FilterRules returns the node's filter table as iptables-save prints it.
func (np *NetworkPolicy) FilterRules(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "nsenter", "--target", fmt.Sprint(np.c.nodePID), "--mount", "--net", "--",
		filepath.Join(np.bin, "bin", "iptables-save"), "-t", "filter").Output()
	if err != nil {
		return "", fmt.Errorf("iptables-save -t filter in the node's namespace: %w", err)
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
// runs through kube-router's default chain (everything allowed).
func (np *NetworkPolicy) PodPolicies(ctx context.Context, namespace, name string) (policies []string, hasChain bool, err error) {
	rules, err := np.FilterRules(ctx)
	if err != nil {
		return nil, false, err
	}
	chain := ""
	lines := strings.Split(rules, "\n")
	for _, l := range lines {
		if m := podJump.FindStringSubmatch(l); m != nil && m[1] == name && m[2] == namespace {
			chain = m[3]
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
			t.Logf("--- kube-router.log (tail)\n%s", testenv.LogTail(filepath.Join(np.c.Dir, "kube-router.log"), 40))
			t.Fatalf("clusterenv: kube-router's rules for Pod %s/%s: %s after %v, want policies %v", namespace, name, last, timeout, want)
		}
	}
}
