//go:build e2e

package deploy

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kedaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

// TestE2EClusterInstall installs deploy/keda into a real single-node cluster
// (internal/testenv/clusterenv) the way deploy/README.md says, from an empty
// cluster: the keys and Secrets, the runner registration, the NATS users of
// nats/authorization.conf (a real nats-server), a SPIRE server with an agent
// on the node, and `kubectl apply -k keda` with the images of `make images`.
// Then the control plane must come up as shipped: the handle-setup Job
// completes (it creates the streams and consumers as NATS user
// handle-setup), dispatch serve is Ready (NATS and Gitea reached from its
// Pod, as NATS user dispatch, with the registered credentials) and the
// gateway is Ready (NATS as user gateway, its own X.509-SVID from the SPIRE
// agent, attested by the k8s workload attestor).
//
// What differs from a production install, because this machine has no
// registry, no DNS and no SPIFFE CSI driver (all said in docs/CLUSTER.md):
// images are imported into the node's containerd and every container's
// imagePullPolicy is set to IfNotPresent; servers outside the cluster (NATS,
// Gitea, the SPIRE server) are named by the address the harness forwards
// them at; the gateway's Workload API volume is the agent's socket folder by
// hostPath (the documented alternative); KEDA's ScaledJobs and the CronJobs
// are not applied (no KEDA operator here yet: issue 16).
func TestE2EClusterInstall(t *testing.T) {
	images := imagesFolder(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c := clusterenv.Start(ctx, t)
	cs := c.Client(t)

	// The peers outside the cluster, each forwarded to the node.
	spire := spireenv.Start(t, spireenv.WithK8sPSAT(clusterenv.SPIRECluster, c.AdminKubeconfig()))
	agentID := c.StartSPIREAgent(ctx, t, spire)
	natsConf, err := os.ReadFile(authorizationFile)
	if err != nil {
		t.Fatal(err)
	}
	// Its monitoring port is KEDA's (the operator runs on the machine).
	monitor := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	nats := startAuthorizedNATSWith(t, string(natsConf), "http: "+monitor)
	natsURL, err := url.Parse(nats.url)
	if err != nil {
		t.Fatal(err)
	}
	natsAddr, err := c.Forward(natsURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	// Gitea's ROOT_URL is where Pods reach it (the URLs it hands executors:
	// server_url, actions, checkout); the machine reaches it there too.
	giteaPort := testenv.FreePort(t)
	giteaAddr, err := c.Forward(fmt.Sprintf("127.0.0.1:%d", giteaPort))
	if err != nil {
		t.Fatal(err)
	}
	// Its webhooks go to the node's address (a NodePort, below): private.
	g := giteaenv.Start(t, giteaenv.Options{Port: giteaPort, RootHost: c.NodeIP(),
		ExtraINI: "[webhook]\nALLOWED_HOST_LIST = loopback,private\n"})
	// handle and recover reach the SPIRE Server API on its socket (a
	// hostPath, as the shipped manifests say), as user 65532.
	if err := os.Chmod(filepath.Dir(spire.Socket), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(spire.Socket, 0o777); err != nil {
		t.Fatal(err)
	}

	// kustomize build keda, with the placeholders of gdr-config set.
	root := copyDeploy(t)
	override(t, filepath.Join(root, "keda"), installNamespace, "gdr.local", "latest")
	docs := buildKustomization(t, filepath.Join(root, "keda"))
	td := spire.TrustDomain
	gatewayID := spiffeid.RequireFromPath(td, "/gateway")
	config := map[string]string{
		"GDR_NATS_URL":          "nats://" + natsAddr,
		"GDR_GITEA_URL":         "http://" + giteaAddr + "/",
		"GDR_TRUST_DOMAIN":      td.Name(),
		"GDR_CLUSTER_NAME":      clusterenv.SPIRECluster,
		"GDR_GATEWAY_SPIFFE_ID": gatewayID.String(),
		// No DNS: the gateway Service's ClusterIP, fixed below.
		"GDR_GATEWAY_URL": "https://" + gatewayClusterIP + ":443",
	}
	var objs []*unstructured.Unstructured
	var pools string
	for _, d := range docs {
		if d.kind() == "CronJob" {
			continue // recover's pass and dispatch run: not needed for these jobs
		}
		obj := &unstructured.Unstructured{Object: d.obj}
		switch {
		case d.kind() == "ConfigMap" && obj.GetName() == "gdr-config":
			for k, v := range config {
				if err := unstructured.SetNestedField(obj.Object, v, "data", k); err != nil {
					t.Fatal(err)
				}
			}
		case d.kind() == "ConfigMap" && obj.GetName() == "gdr-pools":
			pools = localPools(t, obj)
		case d.kind() == "Deployment" && obj.GetName() == "gateway":
			_ = unstructured.SetNestedField(obj.Object, int64(1), "spec", "replicas")
		case d.kind() == "Service" && obj.GetName() == "gateway":
			_ = unstructured.SetNestedField(obj.Object, gatewayClusterIP, "spec", "clusterIP")
		}
		walk(obj.Object, func(m map[string]any) {
			if m["type"] == "nats-jetstream" {
				if md, ok := m["metadata"].(map[string]any); ok {
					md["natsServerMonitoringEndpoint"] = monitor
				}
			}
			if hp, ok := m["hostPath"].(map[string]any); ok && hp["path"] == "/run/spire/server-sockets" {
				hp["path"] = filepath.Dir(spire.Socket)
			}
			if _, ok := m["image"].(string); ok {
				m["imagePullPolicy"] = "IfNotPresent" // no registry: the images are imported
			}
			if csi, ok := m["csi"].(map[string]any); ok && csi["driver"] == "csi.spiffe.io" {
				delete(m, "csi")
				m["hostPath"] = map[string]any{"path": clusterenv.SPIREAgentSocketDir, "type": "Directory"}
			}
		})
		objs = append(objs, obj)
	}
	if pools == "" {
		t.Fatal("no gdr-pools ConfigMap in the build")
	}

	// A service for a job's services: (a sidecar of its executor Pod).
	echo, err := clusterenv.BuildImage(ctx, t, "echo", "./internal/testenv/clusterenv/testdata/echo")
	if err == nil {
		err = c.ImportImage(ctx, echo, "gdr.local/echo")
	}
	if err != nil {
		t.Fatal(err)
	}
	// The images, as `make images` built them, under the names the
	// kustomization's images: now give them (override above).
	for _, name := range []string{"dispatch", "handle", "recover", "gateway", "runner", "runner-host"} {
		if err := c.ImportImage(ctx, filepath.Join(images, name), "gdr.local/gitea-dynamic-runner-"+name); err != nil {
			t.Fatal(err)
		}
	}

	// deploy/README.md's "Secrets and keys" and the runner registration.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: installNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitServiceAccount(ctx, t, installNamespace)
	key := func(n int) []byte {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return []byte(base64.StdEncoding.EncodeToString(b))
	}
	seed := make([]byte, ed25519.SeedSize)
	_, _ = rand.Read(seed)
	verify := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	secrets := map[string]map[string][]byte{
		"gdr-secrets": {
			"bootstrap-key": key(32), "payload-key": key(32), "webhook-secret": key(24), "tick-token": key(32),
			"assignment-signing-key": []byte(base64.StdEncoding.EncodeToString(seed)),
		},
		"gdr-runner-credentials": registerPools(ctx, t, g, pools),
	}
	for _, u := range natsUsers {
		data, err := os.ReadFile(nats.seeds[u])
		if err != nil {
			t.Fatal(err)
		}
		secrets["gdr-nats-"+strings.ReplaceAll(strings.ToLower(u), "_", "-")] = map[string][]byte{"nkey": data}
	}
	for name, data := range secrets {
		if _, err := cs.CoreV1().Secrets(installNamespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CoreV1().ConfigMaps(installNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "gdr-assignment-verify-keys"},
		Data:       map[string]string{"verify-keys": base64.StdEncoding.EncodeToString(verify)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The gateway's registration entry (deploy/README.md): its ServiceAccount
	// in this namespace, on this node's agent.
	resp, err := spire.Entries().BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*spiretypes.Entry{{
		SpiffeId: &spiretypes.SPIFFEID{TrustDomain: td.Name(), Path: gatewayID.Path()},
		ParentId: &spiretypes.SPIFFEID{TrustDomain: td.Name(), Path: agentID.Path()},
		Selectors: []*spiretypes.Selector{
			{Type: "k8s", Value: "ns:" + installNamespace},
			{Type: "k8s", Value: "sa:gitea-dynamic-runner-gateway"},
		},
	}}})
	if err != nil || resp.GetResults()[0].GetStatus().GetCode() != 0 {
		t.Fatalf("gateway entry: %v %v", err, resp)
	}

	// KEDA's operator (on the machine, its CRDs installed), then kubectl
	// apply -k keda (server-side apply).
	keda := kedaenv.Start(ctx, t, c.Plane.RESTConfig(), kedaenv.Options{WatchNamespace: installNamespace})
	applyAll(ctx, t, c, objs)
	waitInstalled(ctx, t, c, cs)

	// A job: dispatch claims it, KEDA starts a handle Job for the
	// assignment, handle creates the executor Pod (its SPIRE entry on this
	// node's agent), the runner gets its SVID, reports through the gateway,
	// and the job ends success in Gitea with its step's log.
	// Gitea's workflow_job webhook reaches dispatch serve as an operator
	// would expose it (here: a NodePort on the node's address, which the
	// machine reaches through the veth; kube-proxy forwards it).
	if _, err := cs.CoreV1().Services(installNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dispatch-webhook"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app.kubernetes.io/name": "dispatch"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), NodePort: dispatchNodePort}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g.AddSystemWebhook(t, fmt.Sprintf("http://%s/webhook", net.JoinHostPort(c.NodeIP(), fmt.Sprint(dispatchNodePort))),
		string(secrets["gdr-secrets"]["webhook-secret"]))
	repo := g.CreateRepo(t, "cluster")
	// A plain job (the pool's runner-host image), a container: job (the
	// runner injected into the job's image; here an image that has a shell,
	// imported like the others: no registry) and a job with a service (a
	// sidecar of its executor Pod, reached by its key), pushed together:
	// three runs, three executor Pods.
	cases := []struct{ name, workflow, want string }{
		{"hello", `on: push
jobs:
  hello:
    runs-on: ubuntu-latest
    steps:
      - run: echo "hello from $(cat /etc/hostname) as $(id -u)"
`, "hello from gdr-linux-"},
		{"boxed", `on: push
jobs:
  boxed:
    runs-on: ubuntu-latest
    container: gdr.local/gitea-dynamic-runner-runner-host:latest
    steps:
      - run: echo "boxed in $(cat /etc/hostname)"
`, "boxed in gdr-linux-"},
		{"served", `on: push
jobs:
  served:
    runs-on: ubuntu-latest
    services:
      echo:
        image: gdr.local/echo:latest
        ports: ["7000:7000"]
    steps:
      - run: |
          exec 3<>/dev/tcp/echo/${{ job.services.echo.ports['7000'] }}
          echo ping >&3
          read -r line <&3
          echo "the service said: $line"
`, "the service said: echo: ping"},
	}
	t0 := time.Now()
	for _, tc := range cases {
		g.PushWorkflow(t, repo, ".gitea/workflows/"+tc.name+".yml", tc.workflow)
	}
	for _, tc := range cases {
		var job giteaenv.Job
		var log string
		for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
			for _, j := range g.Jobs(t, repo) {
				if j.Name == tc.name {
					job = j
				}
			}
			if job.Status == "completed" {
				log = g.JobLogs(t, repo, job.ID)
				break
			}
			if time.Now().After(deadline) {
				break
			}
		}
		if job.Status != "completed" || job.Conclusion != "success" {
			dumpPods(ctx, t, cs)
			t.Logf("keda-operator log:\n%s", keda.LogTail(40))
			t.Fatalf("job %+v, want completed success", job)
		}
		if !strings.Contains(log, tc.want) {
			t.Fatalf("job %s's log lacks %q:\n%s", job.Name, tc.want, log)
		}
		t.Logf("job %s success, seen %v after the pushes", tc.name, time.Since(t0).Round(time.Millisecond))
	}

	// Nothing of the jobs is left running: the executor Pods go (the finish
	// notice's recover-finish Job, KEDA again) and no handle Job runs.
	t1 := time.Now()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		pods, err := cs.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue // a finished Job's Pod, kept as history
			}
			if name := p.Labels["app.kubernetes.io/name"]; name == "dispatch" || name == "gateway" {
				continue // the long-running control plane
			}
			left = append(left, p.Name+" ("+string(p.Status.Phase)+")")
		}
		if len(left) == 0 {
			t.Logf("no executor or handle Pod left %v after the jobs ended", time.Since(t1).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			dumpPods(ctx, t, cs)
			t.Fatalf("left running after the jobs: %v", left)
		}
	}
}

// gatewayClusterIP is the gateway Service's ClusterIP in the install test
// (the cluster has no DNS to resolve "gateway").
const gatewayClusterIP = "10.0.0.200"

// dispatchNodePort is where Gitea's webhooks reach dispatch serve.
const dispatchNodePort = 30080

// localPools rewrites the pools file of the gdr-pools ConfigMap obj for this
// cluster: the executor images are the imported ones (IfNotPresent), and the
// Workload API comes from the agent's socket folder by hostPath. It returns
// the rewritten file.
func localPools(t *testing.T, obj *unstructured.Unstructured) string {
	t.Helper()
	text, _, _ := unstructured.NestedString(obj.Object, "data", "pools.yaml")
	var pools map[string]any
	if err := yaml.Unmarshal([]byte(text), &pools); err != nil {
		t.Fatal(err)
	}
	walk(pools, func(m map[string]any) {
		for _, k := range []string{"image", "runnerImage"} {
			if img, ok := m[k].(string); ok {
				m[k] = strings.Replace(img, "ghcr.io/example/", "gdr.local/", 1)
				if k == "image" {
					m["imagePullPolicy"] = "IfNotPresent"
				}
			}
		}
		if _, ok := m["podTemplate"]; ok {
			m["workloadAPI"] = map[string]any{"hostPath": clusterenv.SPIREAgentSocketDir}
		}
	})
	out, err := yaml.Marshal(pools)
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(obj.Object, string(out), "data", "pools.yaml"); err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// imagesFolder is `make images`' output (bin/images), or the test is
// unavailable (skipped on a developer machine, failed under CI=true).
func imagesFolder(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "bin", "images"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "gateway", "index.json")); err != nil {
		testenv.Unavailable(t, fmt.Sprintf("no images in %s: run `make images`", dir))
	}
	return dir
}

// registerPools registers every pool of the pools file with Gitea, as
// `dispatch register` does, and returns the files of the state folder: the
// data of the gdr-runner-credentials Secret.
func registerPools(ctx context.Context, t *testing.T, g *giteaenv.Server, poolsYAML string) map[string][]byte {
	t.Helper()
	state := t.TempDir()
	file := filepath.Join(t.TempDir(), "pools.yaml")
	if err := os.WriteFile(file, []byte(poolsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	pools, err := runnerpool.Source{PoolsFile: file, StateDir: state}.Load()
	if err != nil {
		t.Fatal(err)
	}
	token := g.RegistrationToken(t)
	for _, p := range pools {
		creds, err := gitea.Register(ctx, g.URL, &http.Client{Timeout: 30 * time.Second}, gitea.Registration{
			Token: token, Name: "gdr-" + p.Name, Labels: p.Labels,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := (gitea.FileStore{Path: p.Credentials}).Save(creds); err != nil {
			t.Fatal(err)
		}
	}
	out := map[string][]byte{}
	ents, err := os.ReadDir(state)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(state, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = data
	}
	return out
}

// applyAll server-side applies objs as a cluster admin (kubectl apply).
func applyAll(ctx context.Context, t *testing.T, c *clusterenv.Cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(c.Plane.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(c.Plane.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(schema.GroupKind{Group: gvk.Group, Kind: gvk.Kind}, gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: no API: %v", gvk.Kind, obj.GetName(), err)
		}
		var res dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			res = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		if _, err := res.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "gdr-e2e", Force: true}); err != nil {
			t.Fatalf("apply %s %s: %v", gvk.Kind, obj.GetName(), err)
		}
	}
}

// waitInstalled waits for the handle-setup Job to complete and the dispatch
// and gateway Deployments to be available, and on failure dumps every Pod's
// status and log.
func waitInstalled(ctx context.Context, t *testing.T, c *clusterenv.Cluster, cs kubernetes.Interface) {
	t.Helper()
	t0 := time.Now()
	done := map[string]time.Duration{}
	check := func() (bool, error) {
		if _, ok := done["handle-setup"]; !ok {
			j, err := cs.BatchV1().Jobs(installNamespace).Get(ctx, "handle-setup", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, cond := range j.Status.Conditions {
				if cond.Type == batchv1.JobFailed && cond.Status == corev1.ConditionTrue {
					return false, fmt.Errorf("handle-setup failed: %s", cond.Message)
				}
				if cond.Type == batchv1.JobComplete && cond.Status == corev1.ConditionTrue {
					done["handle-setup"] = time.Since(t0)
				}
			}
		}
		for _, name := range []string{"dispatch", "gateway"} {
			if _, ok := done[name]; ok {
				continue
			}
			d, err := cs.AppsV1().Deployments(installNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, cond := range d.Status.Conditions {
				if cond.Type == appsv1.DeploymentAvailable && cond.Status == corev1.ConditionTrue && d.Status.ReadyReplicas > 0 {
					done[name] = time.Since(t0)
				}
			}
		}
		return len(done) == 3, nil
	}
	deadline := time.Now().Add(4 * time.Minute)
	for {
		ok, err := check()
		if ok {
			t.Logf("installed: %v after apply", done)
			return
		}
		if err != nil || time.Now().After(deadline) || ctx.Err() != nil {
			dumpPods(ctx, t, cs)
			t.Fatalf("install not up (%v; done: %v)", err, done)
		}
		time.Sleep(time.Second)
	}
}

func dumpPods(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	pods, err := cs.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("list pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		t.Logf("pod %s: %s %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
		for _, ctr := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			b, err := cs.CoreV1().Pods(installNamespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr.Name, TailLines: ptrTo(int64(30))}).DoRaw(ctx)
			t.Logf("--- %s/%s log (%v):\n%s", p.Name, ctr.Name, err, b)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }
