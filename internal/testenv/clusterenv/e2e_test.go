//go:build e2e

package clusterenv

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
)

func ptr[T any](v T) *T { return &v }

// TestE2ECluster starts one cluster (a few tens of seconds) and runs, from a
// locally built image (`hello --version`, exits 0):
//   - Pod: a Pod bound to the node by nodeName (no scheduler), to Succeeded,
//     its log read through the API server (which asks the kubelet);
//   - Scheduled: a Pod without nodeName, bound by kube-scheduler;
//   - Job: a Job, whose Pod kube-controller-manager's Job controller
//     creates, to Complete;
//   - ServiceAccount: a Pod reads its projected ServiceAccount token;
//   - InCluster: a Pod reaches the API server through the "kubernetes"
//     Service (kube-proxy), verifies its certificate with the projected CA
//     and is authorized by RBAC as its ServiceAccount: listing pods is
//     allowed (a Role), listing secrets forbidden;
//   - Forward: a server on the machine's 127.0.0.1 is reached from a Pod at
//     Forward's address and through a Service without a selector;
//   - SPIRE: a SPIRE agent runs as a Pod (k8s_psat node attestation against
//     a real spire-server), and a workload Pod gets the X.509-SVID of an
//     entry selecting its namespace (the k8s workload attestor asks this
//     kubelet), through the agent's socket by hostPath;
//   - Teardown: Stop leaves no process, veth or cgroup of the node behind,
//     and restores the sysctls the kubelet changed.
func TestE2ECluster(t *testing.T) {
	t.Parallel() // beside the other clusters of the machine (ClustersEnv)
	ctx, cancel := context.WithTimeout(Reserve(context.Background(), t), 15*time.Minute)
	defer cancel()
	t0 := time.Now()
	c := Start(ctx, t)
	t.Logf("cluster up, node Ready, in %v", time.Since(t0).Round(time.Millisecond))
	hello, err := BuildImage(ctx, t, "hello", "./internal/imagebuild/testdata/hello")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ImportImage(ctx, hello, "gdr.local/hello"); err != nil {
		t.Fatal(err)
	}
	cs := c.Client(t)
	container := corev1.Container{
		Name: "hello", Image: "gdr.local/hello:latest", ImagePullPolicy: corev1.PullNever,
		Args: []string{"--version"},
	}

	namespace := func(t *testing.T) string {
		ns := c.Plane.Namespace(t)
		c.WaitServiceAccount(ctx, t, ns)
		return ns
	}
	t.Run("Pod", func(t *testing.T) {
		ns := namespace(t)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "hello"},
			Spec:       corev1.PodSpec{NodeName: NodeName, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{container}},
		}
		_ = runPod(ctx, t, c, cs, ns, pod)
	})
	t.Run("Scheduled", func(t *testing.T) {
		ns := namespace(t)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "hello"},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{container}},
		}
		_ = runPod(ctx, t, c, cs, ns, pod)
	})
	t.Run("Job", func(t *testing.T) {
		ns := namespace(t)
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "hello"},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{container},
			}}},
		}
		t1 := time.Now()
		if _, err := cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for {
			j, err := cs.BatchV1().Jobs(ns).Get(ctx, "hello", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			done := false
			for _, cond := range j.Status.Conditions {
				if cond.Status == corev1.ConditionTrue && cond.Type == batchv1.JobComplete {
					done = true
				}
				if cond.Status == corev1.ConditionTrue && cond.Type == batchv1.JobFailed {
					c.DumpLogs(t)
					t.Fatalf("job failed: %+v", j.Status)
				}
			}
			if done {
				break
			}
			if ctx.Err() != nil {
				c.DumpLogs(t)
				t.Fatalf("job not complete: %+v", j.Status)
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("job Complete %v after create", time.Since(t1).Round(time.Millisecond))
	})
	t.Run("ServiceAccount", func(t *testing.T) {
		probe, err := BuildImage(ctx, t, "probe", "./internal/testenv/clusterenv/testdata/probe")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ImportImage(ctx, probe, "gdr.local/probe"); err != nil {
			t.Fatal(err)
		}
		ns := namespace(t)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "probe", Image: "gdr.local/probe:latest", ImagePullPolicy: corev1.PullNever,
			}}},
		}
		log := runPod(ctx, t, c, cs, ns, pod)
		if !strings.Contains(log, "namespace="+ns+" ") || strings.Contains(log, "token=0 ") || strings.Contains(log, " ca=0 ") {
			t.Fatalf("probe saw no token, CA or namespace: %q", log)
		}
	})
	probeImage := sync.OnceValue(func() error {
		probe, err := BuildImage(ctx, t, "probe", "./internal/testenv/clusterenv/testdata/probe")
		if err == nil {
			err = c.ImportImage(ctx, probe, "gdr.local/probe")
		}
		return err
	})
	probePod := func(args ...string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "probe", Image: "gdr.local/probe:latest", ImagePullPolicy: corev1.PullNever, Args: args,
			}}},
		}
	}
	t.Run("InCluster", func(t *testing.T) {
		if err := probeImage(); err != nil {
			t.Fatal(err)
		}
		ns := namespace(t)
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
		log := runPod(ctx, t, c, cs, ns, probePod("sa", "api"))
		if !strings.Contains(log, "host=10.0.0.1") || !strings.Contains(log, "pods=200 secrets=403") {
			t.Fatalf("probe through the kubernetes Service: %q, want host=10.0.0.1 and pods=200 secrets=403", log)
		}
	})
	t.Run("Forward", func(t *testing.T) {
		if err := probeImage(); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
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
		addr, err := c.Forward(l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		host, portText, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(portText)
		ns := namespace(t)
		svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "echo"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "echo", Port: 7000, TargetPort: intstr.FromInt32(int32(port))}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "echo", Labels: map[string]string{discoveryv1.LabelServiceName: "echo"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{host}}},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("echo"), Port: ptr(int32(port)), Protocol: ptr(corev1.ProtocolTCP)}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		viaService := net.JoinHostPort(svc.Spec.ClusterIP, "7000")
		log := runPod(ctx, t, c, cs, ns, probePod("dial="+addr, "dial="+viaService))
		for _, want := range []string{"dial " + addr + ": echo: ping from probe", "dial " + viaService + ": echo: ping from probe"} {
			if !strings.Contains(log, want) {
				t.Fatalf("probe log %q lacks %q", log, want)
			}
		}
	})
	t.Run("SPIRE", func(t *testing.T) {
		server := spireenv.Start(t, spireenv.WithK8sPSAT(SPIRECluster, c.AdminKubeconfig()))
		t1 := time.Now()
		agentIDs := c.StartSPIREAgent(ctx, t, server, 0)
		if len(agentIDs) != 1 {
			t.Fatalf("%d SPIRE agents on one node", len(agentIDs))
		}
		agentID := agentIDs[0]
		t.Logf("SPIRE agent %s attested %v after create", agentID, time.Since(t1).Round(time.Millisecond))
		ns := namespace(t)
		id := spiffeid.RequireFromPath(server.TrustDomain, "/ci/probe")
		resp, err := server.Entries().BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{{
			SpiffeId:  &types.SPIFFEID{TrustDomain: id.TrustDomain().Name(), Path: id.Path()},
			ParentId:  &types.SPIFFEID{TrustDomain: agentID.TrustDomain().Name(), Path: agentID.Path()},
			Selectors: []*types.Selector{{Type: "k8s", Value: "ns:" + ns}},
		}}})
		if err != nil || resp.GetResults()[0].GetStatus().GetCode() != 0 {
			t.Fatalf("create entry: %v %v", err, resp)
		}
		dir := corev1.HostPathDirectory
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "workload"},
			Spec: corev1.PodSpec{
				// The entry reaches the agent within its sync interval: a
				// fetch before that finds no identity and is retried.
				RestartPolicy: corev1.RestartPolicyOnFailure,
				Containers: []corev1.Container{{
					Name: "workload", Image: "gdr.local/spire-agent:latest", ImagePullPolicy: corev1.PullNever,
					Args:         []string{"api", "fetch", "x509", "-socketPath", SPIREAgentSocketDir + "/spire-agent.sock"},
					VolumeMounts: []corev1.VolumeMount{{Name: "spire", MountPath: SPIREAgentSocketDir, ReadOnly: true}},
				}},
				Volumes: []corev1.Volume{{Name: "spire", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: SPIREAgentSocketDir, Type: &dir}}}},
			},
		}
		log := runPod(ctx, t, c, cs, ns, pod)
		if !strings.Contains(log, id.String()) {
			t.Fatalf("workload's X.509-SVID fetch: %q, want %s", log, id)
		}
	})
	t.Run("Teardown", func(t *testing.T) { assertTeardown(t, c) })
}

// assertTeardown stops c and checks that it left nothing on the machine:
// no node's init, veth or cgroup, the sysctls the kubelets changed
// restored (when no other cluster runs), the cluster's folder gone.
func assertTeardown(t *testing.T, c *Cluster) {
	t.Helper()
	changed := map[string]string{}
	for s, before := range c.hold.sysctls {
		if now := readSysctl(t, s); now != before {
			changed[s] = before + " -> " + now
		}
	}
	t.Logf("sysctls the kubelets changed: %v", changed)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if c.restored {
		for s, before := range c.hold.sysctls {
			if now := readSysctl(t, s); now != before {
				t.Errorf("sysctl %s is %s after Stop, was %s", s, now, before)
			}
		}
	} else {
		t.Logf("another cluster runs: the sysctls are the last one's to restore (TestMachineLastRestores)")
	}
	for _, n := range c.nodes {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", n.pid)); err == nil {
			t.Errorf("node %s's init (pid %d) outlived Stop", n.name, n.pid)
		}
		if out, err := exec.Command("ip", "link", "show", n.hostIf).CombinedOutput(); err == nil {
			t.Errorf("node %s's %s outlived Stop: %s", n.name, n.hostIf, out)
		}
		if m, _ := filepath.Glob("/sys/fs/cgroup/*" + n.cgroupDir); len(m) > 0 {
			t.Errorf("node %s's cgroups outlived Stop: %v", n.name, m)
		}
	}
	// The links between nodes were never the machine's.
	if out, err := exec.Command("ip", "-o", "link", "show").CombinedOutput(); err != nil {
		t.Error(err)
	} else if strings.Contains(string(out), "gdrn") || strings.Contains(string(out), "gdrh"+c.id) {
		t.Errorf("a link of the cluster's is on the machine after Stop:\n%s", out)
	}
	if _, err := os.Stat(c.Dir); err == nil && os.Getenv("GDR_KEEP_CLUSTER_DIR") == "" {
		t.Errorf("%s outlived Stop", c.Dir)
	}
}

func readSysctl(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc/sys", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// runPod creates pod in ns, waits for Succeeded, and returns its log, read
// through the API server (checked to be hello's when the image is hello).
func runPod(ctx context.Context, t *testing.T, c *Cluster, cs kubernetes.Interface, ns string, pod *corev1.Pod) string {
	t.Helper()
	t1 := time.Now()
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodSucceeded {
			want := cmp.Or(pod.Spec.NodeName, NodeName) // bound by the test, or by the scheduler to the only node
			if p.Spec.NodeName != want {
				t.Fatalf("pod ran on %q, want %s", p.Spec.NodeName, want)
			}
			break
		}
		if p.Status.Phase == corev1.PodFailed || ctx.Err() != nil {
			c.DumpLogs(t)
			t.Fatalf("pod %s: %+v", p.Status.Phase, p.Status)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("pod Succeeded %v after create", time.Since(t1).Round(time.Millisecond))
	rc, err := cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: pod.Spec.Containers[0].Name}).Stream(ctx)
	if err != nil {
		c.DumpLogs(t)
		t.Fatalf("logs through the API server: %v", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	// hello answers --version as every function does: its name, then the
	// build's version (a stamped commit or "(devel)"), then the toolchain.
	if pod.Spec.Containers[0].Name == "hello" && (!strings.HasPrefix(string(b), "hello ") || !strings.Contains(string(b), " go1.")) {
		t.Fatalf("log %q, want \"hello <version> go1...\"", b)
	}
	t.Logf("log through the API server: %q", strings.TrimSpace(string(b)))
	return string(b)
}
