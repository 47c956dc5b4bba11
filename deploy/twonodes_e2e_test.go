//go:build e2e

package deploy

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// TestE2EClusterTwoNodes installs deploy/keda as installKEDA does (kubectl apply -k, SPIRE as
// shipped: an agent on every node, the control plane's entries under each), but on a two-node
// cluster (clusterenv.Options{Nodes: 2}), with kube-router enforcing the shipped NetworkPolicies
// on both nodes from the start:
//   - Spread: jobs pushed at once, in rounds of four until their executors have run on both
//     nodes (pod.Spec.NodeName): every job succeeds, and every executor, while it runs, holds its
//     own task's identity: the SVID minted into its Pod's Secret names the repository it was
//     pushed to and the task of its Pod's labels, as its annotation says;
//   - Isolation: on each node an executor-like probe (the pod backend's labels) connects every
//     second to an executor-like echo Pod on the other node, NATS, the API server (Service and
//     address), the other node's kubelet, the dispatch Pod and the gateway's metrics port (all
//     refused) and to the gateway's 8443, directly and through its Service (answers), whichever
//     node those are on; every target is on the other node for at least one of the probes. With
//     the policies deleted, every connection answers: the refusals were the policies', not the
//     way between the nodes.
func TestE2EClusterTwoNodes(t *testing.T) {
	clusterenv.KubeRouterAssets(t) // before the install: skip (or fail, CI=true) at once
	ctx, cancel := clusterTest(t, 20*time.Minute)
	defer cancel()
	t0 := time.Now()
	// The probes reach the gateway and dispatch between jobs: both stay up.
	in := installKEDAWith(ctx, t, installOptions{nodes: 2, alwaysUp: true})
	np := in.c.StartNetworkPolicy(ctx, t)
	nodes := in.c.NodeNames()
	if len(nodes) != 2 {
		t.Fatalf("nodes %v, want two", nodes)
	}
	t.Logf("installed on %v, kube-router on both, in %v", nodes, time.Since(t0).Round(time.Second))
	in.runSteps(ctx, t, []step{
		{"Spread", func(t *testing.T) { in.spread(ctx, t, nodes) }},
		{"Isolation", func(t *testing.T) { in.isolationAcrossNodes(ctx, t, np, nodes) }},
	})
}

// spread pushes rounds of four jobs at once until executors have run on every node of nodes (at
// most three rounds); see TestE2EClusterTwoNodes. The executors are watched from before the first
// push: on a loaded machine the pushes take long enough for the first jobs to end before the
// last is pushed.
func (in *installation) spread(ctx context.Context, t *testing.T, nodes []string) {
	td := spiffeid.RequireTrustDomainFromString(spireenv.TrustDomain)
	ran := map[string][]string{} // node -> the executor Pods seen running there
	for round := 1; len(ran) < len(nodes); round++ {
		if round > 3 {
			t.Fatalf("after 3 rounds of 4 jobs at once, executors ran on %v only, want every node of %v", ran, nodes)
		}
		watch := in.watchExecutors(ctx)
		names := map[string]string{} // repo -> its job's name
		t1 := time.Now()
		for i := range 4 {
			name := fmt.Sprintf("spread-%d-%d", round, i)
			names[in.pushJob(t, name, `sleep 8; echo "spread done in $(cat /etc/hostname)"`)] = name
		}
		// Each executor, once scheduled and while it ran: its node, its identity.
		seen := watch.wait(t, names, 4*time.Minute)
		if len(seen) < len(names) {
			in.dump(ctx, t)
			t.Fatalf("round %d: executors seen running for %d of %d jobs after 4m", round, len(seen), len(names))
		}
		for repo, o := range seen {
			checkIdentity(t, td, o, repo, names[repo])
			ran[o.pod.Spec.NodeName] = append(ran[o.pod.Spec.NodeName], o.pod.Name)
		}
		for repo, name := range names {
			in.succeeded(ctx, t, repo, name, "spread done in gdr-linux-")
		}
		t.Logf("round %d: 4 jobs succeeded %v after the pushes; executors so far by node: %v", round, time.Since(t1).Round(time.Second), ran)
	}
	for _, n := range nodes {
		if len(ran[n]) == 0 {
			t.Errorf("no executor ran on %s: %v", n, ran)
		}
	}
}

// runningExecutor is an executor Pod seen running, and its Secret as it was then (the Secret
// goes with the executor when its job ends).
type runningExecutor struct {
	pod    *corev1.Pod
	secret map[string][]byte
	err    error // reading the Secret
}

// executorWatch records every executor Pod of the installation seen running, by repository,
// until wait returns.
type executorWatch struct {
	mu    sync.Mutex
	seen  map[string]runningExecutor
	stop  context.CancelFunc
	ended chan struct{}
}

// watchExecutors starts recording the running executors every 300 ms.
func (in *installation) watchExecutors(ctx context.Context) *executorWatch {
	ctx, stop := context.WithCancel(ctx)
	w := &executorWatch{seen: map[string]runningExecutor{}, stop: stop, ended: make(chan struct{})}
	go func() {
		defer close(w.ended)
		for ctx.Err() == nil {
			// A failed List (a restart of the API server's connection) is the next tick's to redo.
			pods, _ := in.cs.CoreV1().Pods(jobsNamespace).List(ctx, metav1.ListOptions{LabelSelector: executorSelector})
			for i := range pods.Items {
				p := &pods.Items[i]
				repo := p.Annotations[repositoryAnnotation]
				w.mu.Lock()
				_, had := w.seen[repo]
				w.mu.Unlock()
				if had || p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning {
					continue
				}
				s, err := in.cs.CoreV1().Secrets(jobsNamespace).Get(ctx, pod.SecretName(p.Name), metav1.GetOptions{})
				r := runningExecutor{pod: p, err: err}
				if err == nil {
					r.secret = s.Data
				}
				w.mu.Lock()
				w.seen[repo] = r
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	return w
}

// wait returns, once every repository of names has had its executor seen running or after
// timeout, what was seen of theirs, and stops the watch.
func (w *executorWatch) wait(t *testing.T, names map[string]string, timeout time.Duration) map[string]runningExecutor {
	t.Helper()
	defer func() { w.stop(); <-w.ended }()
	for deadline := time.Now().Add(timeout); ; time.Sleep(300 * time.Millisecond) {
		w.mu.Lock()
		ours := map[string]runningExecutor{}
		for repo := range names {
			if r, ok := w.seen[repo]; ok {
				ours[repo] = r
			}
		}
		w.mu.Unlock()
		if len(ours) == len(names) || time.Now().After(deadline) {
			return ours
		}
	}
}

// checkIdentity fails t unless the executor o, seen running, held the identity of its own task:
// the SVID in its Secret (minted by handle-pod) is the task identity of repo, job name and the task
// ID of its Pod's labels, which its SPIFFE ID annotation names too.
func checkIdentity(t *testing.T, td spiffeid.TrustDomain, o runningExecutor, repo, name string) {
	t.Helper()
	p := o.pod
	task, err := strconv.ParseInt(p.Labels["gitea-dynamic-runner.io/task-id"], 10, 64)
	if err != nil {
		t.Fatalf("executor %s: task-id label: %v", p.Name, err)
	}
	want, err := taskidentity.New(td, repo, name, task)
	if err != nil {
		t.Fatal(err)
	}
	if o.err != nil {
		t.Fatalf("executor %s's Secret: %v", p.Name, o.err)
	}
	block, _ := pem.Decode(o.secret[bootstrap.EnvSVIDCert])
	if block == nil {
		t.Fatalf("executor %s's Secret holds no SVID certificate (%s)", p.Name, bootstrap.EnvSVIDCert)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	got, err := x509svid.IDFromCert(cert)
	if err != nil {
		t.Fatalf("executor %s's SVID: %v", p.Name, err)
	}
	if got.String() != want.SPIFFEID || p.Annotations["gitea-dynamic-runner.io/spiffe-id"] != want.SPIFFEID ||
		p.Annotations["gitea-dynamic-runner.io/job-key"] != name {
		t.Fatalf("executor %s on %s (job %s of %s, task %d): SVID %s, annotations %v; want %s",
			p.Name, p.Spec.NodeName, name, repo, task, got, p.Annotations, want.SPIFFEID)
	}
	t.Logf("executor %s on %s: %s", p.Name, p.Spec.NodeName, got)
}

// isolationAcrossNodes runs TestE2EClusterIsolation's probes with every target on the other
// node for at least one probe; see TestE2EClusterTwoNodes.
func (in *installation) isolationAcrossNodes(ctx context.Context, t *testing.T, np *clusterenv.NetworkPolicy, nodes []string) {
	docs := buildKustomization(t, "keda")
	executorLabels := executorPod(t, docs).Labels
	policies := loadPolicies(t, docs)
	probeImage, err := clusterenv.BuildImage(ctx, t, "probe", "./internal/testenv/clusterenv/testdata/probe")
	if err == nil {
		err = in.c.ImportImage(ctx, probeImage, "gdr.local/probe")
	}
	if err != nil {
		t.Fatal(err)
	}
	gateway := in.gatewayPod(ctx, t)
	dispatch := in.dispatchPod(ctx, t)
	t.Logf("gateway %s on %s, dispatch %s on %s", gateway.Name, gateway.Spec.NodeName, dispatch.Name, dispatch.Spec.NodeName)
	natsURL, err := url.Parse(in.nats.url)
	if err != nil {
		t.Fatal(err)
	}
	apiURL, err := url.Parse(in.c.Plane.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	pinned := func(p *corev1.Pod, node string) *corev1.Pod { p.Spec.NodeName = node; return p }
	echoes := map[string]*corev1.Pod{}
	for _, n := range nodes {
		echoes[n] = in.runPod(ctx, t, pinned(executorLike(executorLabels, "twonodes-echo-"+n, echoContainer()), n))
	}
	type probe struct {
		pod     *corev1.Pod
		targets []isolationTarget
	}
	var probes []probe
	for i, n := range nodes {
		other := nodes[(i+1)%len(nodes)]
		targets := []isolationTarget{
			{"other-executor", net.JoinHostPort(echoes[other].Status.PodIP, "7000"), true},
			{"nats", net.JoinHostPort(in.c.NodeIP(), natsURL.Port()), true}, // the first node's address
			{"api-service", "10.0.0.1:443", true},
			{"api-node", net.JoinHostPort(in.c.NodeIP(), apiURL.Port()), true},
			{"kubelet", net.JoinHostPort(in.c.NodeIPOf(other), "10250"), true},
			{"dispatch", net.JoinHostPort(dispatch.Status.PodIP, "8080"), true},
			{"gateway-metrics", net.JoinHostPort(gateway.Status.PodIP, "9090"), true},
			{"gateway", net.JoinHostPort(gateway.Status.PodIP, "8443"), false},
			{"gateway-service", net.JoinHostPort(gatewayClusterIP, "443"), false},
		}
		args := []string{"every=1s"}
		for _, tg := range targets {
			args = append(args, "connect="+tg.label+"@"+tg.addr)
		}
		p := in.runPod(ctx, t, pinned(executorLike(executorLabels, "twonodes-probe-"+n, corev1.Container{
			Name: "probe", Image: "gdr.local/probe:latest", ImagePullPolicy: corev1.PullIfNotPresent, Args: args,
		}), n))
		probes = append(probes, probe{p, targets})
	}
	concerned := []*corev1.Pod{gateway, dispatch}
	for _, n := range nodes {
		concerned = append(concerned, echoes[n])
	}
	for _, p := range probes {
		concerned = append(concerned, p.pod)
	}

	var enforced time.Time
	for _, p := range concerned {
		enforced = later(enforced, np.WaitPodPolicies(ctx, t, p.Namespace, p.Name, policies.selecting(t, p), 2*time.Minute))
	}
	for _, p := range probes {
		round := in.probeRound(ctx, t, p.pod.Name, enforced)
		for _, tg := range p.targets {
			got := round[tg.label]
			if tg.denied && got == "ok" {
				t.Errorf("policies enforced: an executor Pod on %s reached %s (%s)", p.pod.Spec.NodeName, tg.label, tg.addr)
			}
			if !tg.denied && got != "ok" {
				t.Errorf("policies enforced: an executor Pod on %s did not reach %s (%s): %s", p.pod.Spec.NodeName, tg.label, tg.addr, got)
			}
		}
		t.Logf("policies enforced, probe on %s: %v", p.pod.Spec.NodeName, round)
	}
	if t.Failed() {
		in.c.DumpLogs(t)
		t.FailNow()
	}

	for _, ns := range []string{installNamespace, jobsNamespace} {
		if err := in.cs.NetworkingV1().NetworkPolicies(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var removed time.Time
	for _, p := range concerned {
		removed = later(removed, np.WaitPodPolicies(ctx, t, p.Namespace, p.Name, nil, 2*time.Minute))
	}
	for _, p := range probes {
		round := in.probeRound(ctx, t, p.pod.Name, removed)
		for _, tg := range p.targets {
			if got := round[tg.label]; got != "ok" {
				t.Errorf("policies removed: an executor Pod on %s did not reach %s (%s): %s", p.pod.Spec.NodeName, tg.label, tg.addr, got)
			}
		}
		t.Logf("policies removed, probe on %s: %v", p.pod.Spec.NodeName, round)
	}
}

// dispatchPod returns the running, Ready dispatch serve Pod (one replica here).
func (in *installation) dispatchPod(ctx context.Context, t *testing.T) *corev1.Pod {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		pods, err := in.cs.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=dispatch,app.kubernetes.io/component=serve"})
		if err != nil {
			t.Fatal(err)
		}
		if i := slices.IndexFunc(pods.Items, func(p corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && podReady(&p) && p.Status.PodIP != ""
		}); i >= 0 {
			return &pods.Items[i]
		}
		if time.Now().After(deadline) {
			var phases []string
			for _, p := range pods.Items {
				phases = append(phases, p.Name+"="+string(p.Status.Phase))
			}
			t.Fatalf("no Ready dispatch serve Pod: %s", strings.Join(phases, " "))
		}
	}
}
