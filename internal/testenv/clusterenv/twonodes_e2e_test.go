//go:build e2e

package clusterenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// TestE2EClusterTwoNodesNetwork starts a two-node cluster (StartWith,
// Options{Nodes: 2}) and checks what crosses between the nodes, with Pods
// bound to each node by nodeName:
//   - Nodes: the nodes register as gdr-node and gdr-node-2, each with its
//     own address as InternalIP, and each Pod gets an address of its node's
//     Pod range;
//   - AcrossNodes: a Pod on each node reaches an echo server Pod on the
//     other node directly and through a ClusterIP Service whose only
//     endpoint is there; the Pod on the second node also reaches a server
//     of the machine's through Forward (the first node's address) and the
//     API server through the "kubernetes" Service (its endpoint on the first
//     node), authorized by RBAC as its ServiceAccount; its log is read
//     through the API server from the second node's kubelet;
//   - NetworkPolicy: kube-router runs on both nodes; a Pod on each node
//     connects every second to the echo Pod on the other node, directly and
//     through its Service: allowed while no policy selects the echo Pods,
//     refused once a NetworkPolicy denying their ingress is programmed (by
//     each echo Pod's own node);
//   - Teardown: Stop leaves no process, veth or cgroup of either node
//     behind, and restores the sysctls the kubelets changed.
func TestE2EClusterTwoNodesNetwork(t *testing.T) {
	t.Parallel() // beside the other clusters of the machine (ClustersEnv)
	ctx, cancel := context.WithTimeout(Reserve(context.Background(), t), 20*time.Minute)
	defer cancel()
	t0 := time.Now()
	c := StartWith(ctx, t, Options{Nodes: 2})
	t.Logf("cluster up, two nodes Ready, in %v", time.Since(t0).Round(time.Millisecond))
	names := c.NodeNames()
	if !slices.Equal(names, []string{"gdr-node", "gdr-node-2"}) {
		t.Fatalf("NodeNames() = %v, want [gdr-node gdr-node-2]", names)
	}
	first, second := names[0], names[1]
	for _, img := range []struct{ name, pkg string }{
		{"probe", "./internal/testenv/clusterenv/testdata/probe"},
		{"echo", "./internal/testenv/clusterenv/testdata/echo"},
	} {
		dir, err := BuildImage(ctx, t, img.name, img.pkg)
		if err == nil {
			err = c.ImportImage(ctx, dir, "gdr.local/"+img.name)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	cs := c.Client(t)
	ns := c.Plane.Namespace(t)
	c.WaitServiceAccount(ctx, t, ns)
	echoPod := func(name, node string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name, "role": "echo"}},
			Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "echo", Image: "gdr.local/echo:latest", ImagePullPolicy: corev1.PullNever,
				Ports: []corev1.ContainerPort{{ContainerPort: 7000}},
			}}},
		}
	}
	probePod := func(name, node string, args ...string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "probe", Image: "gdr.local/probe:latest", ImagePullPolicy: corev1.PullNever, Args: args,
			}}},
		}
	}
	echo1 := runningPod(ctx, t, c, cs, ns, echoPod("echo-1", first))
	echo2 := runningPod(ctx, t, c, cs, ns, echoPod("echo-2", second))
	svc1, svc2 := echoService(ctx, t, cs, ns, "echo-1"), echoService(ctx, t, cs, ns, "echo-2")
	at1, at2 := net.JoinHostPort(echo1.Status.PodIP, "7000"), net.JoinHostPort(echo2.Status.PodIP, "7000")

	t.Run("Nodes", func(t *testing.T) {
		for i, name := range names {
			n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var internal []string
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					internal = append(internal, a.Address)
				}
			}
			if !slices.Equal(internal, []string{c.nodes[i].ip}) || c.NodeIPOf(name) != c.nodes[i].ip {
				t.Errorf("node %s: InternalIP %v, NodeIPOf %q; want %s", name, internal, c.NodeIPOf(name), c.nodes[i].ip)
			}
		}
		if c.NodeIP() != c.NodeIPOf(first) || c.NodeIPOf(first) == c.NodeIPOf(second) {
			t.Errorf("NodeIP() %s, the nodes' %s and %s: want the first node's, and two addresses", c.NodeIP(), c.NodeIPOf(first), c.NodeIPOf(second))
		}
		for _, p := range []struct {
			pod  *corev1.Pod
			cidr string
		}{{echo1, "10.244.0.0/24"}, {echo2, "10.244.1.0/24"}} {
			if !netip.MustParsePrefix(p.cidr).Contains(netip.MustParseAddr(p.pod.Status.PodIP)) {
				t.Errorf("Pod %s on %s has %s, want an address of %s", p.pod.Name, p.pod.Spec.NodeName, p.pod.Status.PodIP, p.cidr)
			}
		}
	})

	t.Run("AcrossNodes", func(t *testing.T) {
		if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pod-reader"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "default", Namespace: ns}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		forwarded, err := c.Forward(machineEcho(t))
		if err != nil {
			t.Fatal(err)
		}
		log := runPod(ctx, t, c, cs, ns, probePod("from-first", first, "dial="+at2, "dial="+svc2))
		for _, want := range []string{"dial " + at2 + ": echo: ping from probe", "dial " + svc2 + ": echo: ping from probe"} {
			if !strings.Contains(log, want) {
				t.Errorf("Pod on %s: log %q lacks %q", first, log, want)
			}
		}
		log = runPod(ctx, t, c, cs, ns, probePod("from-second", second, "dial="+at1, "dial="+svc1, "dial="+forwarded, "sa", "api"))
		for _, want := range []string{
			"dial " + at1 + ": echo: ping from probe", "dial " + svc1 + ": echo: ping from probe",
			"dial " + forwarded + ": echo: ping from probe", "host=10.0.0.1", "pods=200 secrets=403",
		} {
			if !strings.Contains(log, want) {
				t.Errorf("Pod on %s: log %q lacks %q", second, log, want)
			}
		}
	})

	t.Run("NetworkPolicy", func(t *testing.T) {
		np := c.StartNetworkPolicy(ctx, t)
		watch1 := runningPod(ctx, t, c, cs, ns, probePod("watch-from-first", first, "every=1s", "connect=pod@"+at2, "connect=service@"+svc2))
		watch2 := runningPod(ctx, t, c, cs, ns, probePod("watch-from-second", second, "every=1s", "connect=pod@"+at1, "connect=service@"+svc1))
		watchers := []*corev1.Pod{watch1, watch2}
		var allowed time.Time
		for _, p := range []*corev1.Pod{echo1, echo2, watch1, watch2} {
			allowed = later(allowed, np.WaitPodPolicies(ctx, t, ns, p.Name, nil, 2*time.Minute))
		}
		for _, w := range watchers {
			round := probeRound(ctx, t, cs, ns, w.Name, allowed)
			if round["pod"] != "ok" || round["service"] != "ok" {
				t.Fatalf("no policy yet: %s on %s reached the other node's echo Pod: %v, want pod=ok service=ok", w.Name, w.Spec.NodeName, round)
			}
			t.Logf("no policy: %s on %s: %v", w.Name, w.Spec.NodeName, round)
		}
		if _, err := cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "deny-echo"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "echo"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var denied time.Time
		for _, p := range []*corev1.Pod{echo1, echo2} {
			denied = later(denied, np.WaitPodPolicies(ctx, t, ns, p.Name, []string{"deny-echo"}, 2*time.Minute))
		}
		for _, w := range watchers {
			round := probeRound(ctx, t, cs, ns, w.Name, denied)
			if round["pod"] == "ok" || round["service"] == "ok" {
				t.Errorf("deny-echo programmed: %s on %s still reached the other node's echo Pod: %v", w.Name, w.Spec.NodeName, round)
			}
			t.Logf("deny-echo: %s on %s: %v", w.Name, w.Spec.NodeName, round)
		}
	})
	t.Run("Teardown", func(t *testing.T) { assertTeardown(t, c) })
}

// runningPod creates pod in ns and returns it once it runs with an address
// on the node it names.
func runningPod(ctx context.Context, t *testing.T, c *Cluster, cs kubernetes.Interface, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			if p.Spec.NodeName != pod.Spec.NodeName {
				t.Fatalf("Pod %s runs on %q, want %s", p.Name, p.Spec.NodeName, pod.Spec.NodeName)
			}
			return p
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded || time.Now().After(deadline) {
			c.DumpLogs(t)
			t.Fatalf("Pod %s: %s, want Running: %+v", p.Name, p.Status.Phase, p.Status)
		}
	}
}

// echoService creates a ClusterIP Service selecting the Pod labelled
// app=name, port 7000, and returns its address.
func echoService(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "echo", Port: 7000, TargetPort: intstr.FromInt32(7000)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(svc.Spec.ClusterIP, "7000")
}

// machineEcho serves the echo protocol on the machine's 127.0.0.1 until the
// test ends, and returns its address.
func machineEcho(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				line, _ := bufio.NewReader(conn).ReadString('\n')
				fmt.Fprintf(conn, "echo: %s", line)
			}()
		}
	}()
	return l.Addr().String()
}

// probeRound returns the results (label -> "ok" or "fail:<reason>") of the
// first complete round the probe Pod name (every=) started after since.
func probeRound(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string, since time.Time) map[string]string {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		raw, err := cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("probe %s's log: %v", name, err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "round" {
				continue
			}
			start, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || !time.Unix(0, start).After(since) {
				continue
			}
			out := map[string]string{}
			for _, r := range f[2:] {
				label, result, _ := strings.Cut(r, "=")
				out[label] = result
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe %s: no round started after %v; log:\n%s", name, since.Format(time.RFC3339Nano), raw)
		}
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
