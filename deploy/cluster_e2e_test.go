//go:build e2e

package deploy

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
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
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/registryenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
)

// installation is deploy/keda installed into a real single-node cluster
// (internal/testenv/clusterenv) the way deploy/README.md says, from an empty
// cluster: the keys and Secrets, the runner registration, the NATS users of
// nats/authorization.conf (a real nats-server), a SPIRE server with an agent
// on the node, KEDA's operator, and `kubectl apply -k keda` (every object of
// the build, the CronJobs included) with the images of `make images`; the
// control plane is up: the handle-setup Job completed (it creates the streams
// and consumers as NATS user handle-setup), dispatch serve is Ready (NATS
// and Gitea reached from its Pod, as NATS user dispatch, with the registered
// credentials) and the gateway is Ready (NATS as user gateway, its own
// X.509-SVID from the SPIRE agent, attested by the k8s workload attestor);
// Gitea's system webhook reaches dispatch through a NodePort.
//
// What differs from a production install, because this machine has no
// registry, no DNS and no SPIFFE CSI driver (all said in docs/CLUSTER.md):
// images are imported into the node's containerd and every container's
// imagePullPolicy is set to IfNotPresent; servers outside the cluster (NATS,
// Gitea, the SPIRE server) are named by the address the harness forwards
// them at; the Workload API volume is the agent's socket folder by hostPath
// (the documented alternative).
type installation struct {
	c    *clusterenv.Cluster
	cs   kubernetes.Interface
	g    *giteaenv.Server
	keda *kedaenv.Operator
	nats authorizedNATS
	// monitor is nats-server's monitoring address (KEDA's trigger reads it).
	monitor string
	// secrets are the data of the Secrets created, by name.
	secrets map[string]map[string][]byte
	// localize rewrites a manifest of deploy/ for this cluster, as the
	// build was (for the manual Jobs, created later): no SPIFFE CSI driver
	// here, the images loaded on the node.
	localize func(obj *unstructured.Unstructured)
	// registry is the private registry, at registryHost from the node.
	registry *registryenv.Registry
	// spire is the SPIRE server (handleKilled pauses it).
	spire        *spireenv.Server
	registryHost string
	// webhook is the ID of Gitea's system webhook to dispatch serve.
	webhook int64
	// releases is the registry of installOptions.release's releases, helm the shell of
	// deploy/README.md's Helm blocks (both nil without one).
	releases *releases
	helm     *readmeShell
	// gitea is Gitea's address from the node (GDR_GITEA_URL's host and port).
	gitea string
	// objs are the objects installKustomize applied, localized (nil with Helm): what an
	// operator's overlay (deploy/README.md's my-deploy) builds.
	objs []*unstructured.Unstructured
}

// installKEDA installs deploy/keda into a new cluster; see installation.
// spireSync is the SPIRE agent's sync interval (zero: SPIRE's default).
func installKEDA(ctx context.Context, t testing.TB, spireSync time.Duration) *installation {
	t.Helper()
	return installKEDAWith(ctx, t, installOptions{spireSync: spireSync})
}

// installOptions are what installKEDAWith varies; the zero value is
// installKEDA's.
type installOptions struct {
	// spireSync is the SPIRE agent's sync interval (zero: SPIRE's default).
	spireSync time.Duration
	// how puts the control plane into the cluster.
	how installMethod
	// defaultWebhookQueue leaves Gitea's webhook_sender queue as Gitea
	// ships it (level, with its backoff) instead of the channel queue
	// deploy/README.md advises.
	defaultWebhookQueue bool
	// podIdentity is GDR_POD_IDENTITY (empty: the shipped default); "workload-api" enables
	// the component of that name, as deploy/README.md tells an operator to.
	podIdentity string
	// podTemplate, when set, edits the spec of the pool linux's Pod template (its map form).
	podTemplate func(spec map[string]any)
	// handleEnv sets variables of the ScaledJob handle-pod's container over the shipped ones.
	handleEnv map[string]string
	// alwaysUp keeps dispatch and the gateway up between jobs (their ScaledObjects'
	// minReplicaCount 1), for the tests that probe or scrape them then; unset, both start at
	// zero and KEDA starts them, as shipped.
	alwaysUp bool
	// build adds the pool build (labels [build]): linux's template with the build capability,
	// enabled by README's "Image builds" blocks (deploy/seccomp's profile on the node, the
	// executors' namespace at Pod Security baseline), the buildkit image imported.
	build bool
	// docker adds the pools docker and docker-userns (labels the same): linux's template with
	// the docker capability, the second with its user namespace, enabled by deploy/README.md's "Docker workflows" block (the build's seccomp
	// profile on the node, the policy, the executors' namespace at Pod Security privileged),
	// the docker image imported.
	docker bool
	// identity is the chart's identity (installHelm only): "ca" starts no SPIRE Server or
	// agent and makes no key by hand (the keys Job makes them, read back after the install);
	// "" is SPIRE, as shipped.
	identity string
	// nodes is the cluster's node count (clusterenv.Options.Nodes; zero: one node). Every node
	// gets a SPIRE agent, and the control plane's entries one under each agent.
	nodes int
	// capacity, when positive, is the pool linux's capacity (the shipped pools file's: 10).
	capacity int
	// release, when set, is the version installHelm installs from a release, with identity
	// ca: made by `make release` for a registry of the test's, pushed there by `make push`, and
	// installed by deploy/README.md's Helm blocks (helm, the CLI: the tokens' Secrets, helm
	// install from the registry), with the test cluster's own values in my-values.yaml (no
	// images: the release's). installation.helm runs the later blocks.
	release string
}

// setEnv sets each of env on every container of the ScaledJob obj's Job template, in place
// of the variable of that name; it fails when one is not there to set.
func setEnv(t testing.TB, obj *unstructured.Unstructured, env map[string]string) {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "jobTargetRef", "template", "spec", "containers")
	for name, value := range env {
		set := false
		for _, c := range containers {
			vars, _ := c.(map[string]any)["env"].([]any)
			for _, v := range vars {
				if v := v.(map[string]any); v["name"] == name {
					v["value"], set = value, true
				}
			}
		}
		if !set {
			t.Fatalf("%s %s sets no %s", obj.GetKind(), obj.GetName(), name)
		}
	}
	if err := unstructured.SetNestedSlice(obj.Object, containers, "spec", "jobTargetRef", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
}

// installMethod is how installKEDAWith puts the control plane into the cluster.
type installMethod int

const (
	// installKustomize: kubectl apply -k keda (server-side apply of the build).
	installKustomize installMethod = iota
	// installHelm: helm install of deploy/helm with the values that give the same objects.
	installHelm
)

// installKEDAWith is installKEDA with the options o.
func installKEDAWith(ctx context.Context, t testing.TB, o installOptions) *installation {
	t.Helper()
	images := imagesFolder(t)
	c := clusterenv.StartWith(ctx, t, clusterenv.Options{Nodes: o.nodes})
	cs := c.Client(t)

	// The peers outside the cluster, each forwarded to the node.
	// The SPIRE server runs the shipped authorization policy: handle-pod and
	// recover reach its TCP API with their own SVIDs (entries below) and may
	// manage task entries only, and handle-pod mint task SVIDs only.
	td := spiffeid.RequireTrustDomainFromString(spireenv.TrustDomain)
	handleID := spiffeid.RequireFromPath(td, "/gitea-dynamic-runner/handle-pod")
	recoverID := spiffeid.RequireFromPath(td, "/gitea-dynamic-runner/recover")
	ca := o.identity == "ca"
	if ca && o.how != installHelm {
		t.Fatal("installOptions.identity ca is the chart's")
	}
	if o.release != "" && !ca {
		t.Fatal("installOptions.release installs as deploy/README.md's Helm section does: identity ca")
	}
	var spire *spireenv.Server
	var agentIDs []spiffeid.ID
	spirePort := "1" // identity ca: no SPIRE Server, the setting unused
	if !ca {
		spire = spireenv.Start(t, spireenv.WithK8sPSAT(clusterenv.SPIRECluster, c.AdminKubeconfig()),
			spireenv.WithShippedPolicy(t, "spire", map[string]any{
				"registrars": []string{handleID.String(), recoverID.String()}, "minters": []string{handleID.String()}}))
		agentIDs = c.StartSPIREAgent(ctx, t, spire, o.spireSync) // one per node; forwards spire.Addr to the nodes
		var err error
		if _, spirePort, err = net.SplitHostPort(spire.Addr); err != nil {
			t.Fatal(err)
		}
	}
	natsConf, err := os.ReadFile(authorizationFile)
	if err != nil {
		t.Fatal(err)
	}
	// Its monitoring port is KEDA's (the operator runs on the machine).
	monitor := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	nats := startAuthorizedNATSWith(t, string(natsConf), "http: "+monitor, nil)
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
	// Its webhook_sender queue is a channel, as deploy/README.md advises.
	ini := "[webhook]\nALLOWED_HOST_LIST = loopback,private\n"
	if !o.defaultWebhookQueue {
		ini += giteaWebhookQueueINI
	}
	g := giteaenv.Start(t, giteaenv.Options{Port: giteaPort, RootHost: c.NodeIP(), ExtraINI: ini})

	// A private registry (basic authentication), reached from the node at
	// registryHost over plain HTTP, holding an image only the pool linux has
	// the credentials for.
	registry := registryenv.Start(t)
	registryHost, err := c.Forward(registry.Addr)
	if err == nil {
		err = c.TrustPlainHTTPRegistry(registryHost)
	}
	if err != nil {
		t.Fatal(err)
	}
	registry.Push(t, filepath.Join(images, "runner-host"), registry.Addr+"/"+privateImage)

	// kustomize build keda, with the placeholders of gdr-config set.
	root := copyDeploy(t)
	override(t, filepath.Join(root, "keda"), installNamespace, "gdr.local", "latest")
	// The actions/cache service's volume (components/cache), on a
	// PersistentVolume of a node folder made for it (no provisioner here).
	enableComponent(t, filepath.Join(root, "keda"), "cache")
	switch o.podIdentity {
	case "", backend.PodIdentityMinted:
	case backend.PodIdentityWorkloadAPI:
		enableComponent(t, filepath.Join(root, "keda"), "workload-api")
	default:
		t.Fatalf("installOptions.podIdentity %q: not a GDR_POD_IDENTITY", o.podIdentity)
	}
	docs := buildKustomization(t, filepath.Join(root, "keda"))
	gatewayID := spiffeid.RequireFromPath(td, "/gateway")
	config := map[string]string{
		"GDR_NATS_URL":          "nats://" + natsAddr,
		"GDR_NATS_REPLICAS":     "1", // the test cluster's NATS is one server
		"GDR_GITEA_URL":         "http://" + giteaAddr + "/",
		"GDR_TRUST_DOMAIN":      td.Name(),
		"GDR_CLUSTER_NAME":      clusterenv.SPIRECluster,
		"GDR_SPIRE_SERVER":      net.JoinHostPort(c.NodeIP(), spirePort),
		"GDR_GATEWAY_SPIFFE_ID": gatewayID.String(),
		// No DNS: the gateway Service's ClusterIP, fixed below.
		"GDR_GATEWAY_URL": "https://" + gatewayClusterIP + ":443",
	}
	localize := func(obj *unstructured.Unstructured) {
		walk(obj.Object, func(m map[string]any) {
			if m["type"] == "nats-jetstream" {
				if md, ok := m["metadata"].(map[string]any); ok {
					md["natsServerMonitoringEndpoint"] = monitor
				}
			}
			if img, ok := m["image"].(string); ok {
				// A manifest outside the kustomization (manual/) names
				// the placeholder registry; no registry: imported images.
				m["image"] = strings.Replace(img, "ghcr.io/example/", "gdr.local/", 1)
				m["imagePullPolicy"] = "IfNotPresent"
			}
			if csi, ok := m["csi"].(map[string]any); ok && csi["driver"] == "csi.spiffe.io" {
				delete(m, "csi")
				m["hostPath"] = map[string]any{"path": clusterenv.SPIREAgentSocketDir, "type": "Directory"}
			}
		})
	}
	var objs []*unstructured.Unstructured
	var pools string
	for _, d := range docs {
		obj := &unstructured.Unstructured{Object: d.obj}
		switch {
		case d.kind() == "ConfigMap" && obj.GetName() == "gdr-config":
			for k, v := range config {
				if err := unstructured.SetNestedField(obj.Object, v, "data", k); err != nil {
					t.Fatal(err)
				}
			}
		case d.kind() == "ConfigMap" && obj.GetName() == "gdr-pools":
			pools = localPools(t, obj, registryHost, o)
		case d.kind() == "ScaledJob" && obj.GetName() == "handle-pod":
			setEnv(t, obj, o.handleEnv)
		case d.kind() == "Service" && obj.GetName() == "gateway":
			_ = unstructured.SetNestedField(obj.Object, gatewayClusterIP, "spec", "clusterIP")
		}
		localize(obj)
		objs = append(objs, obj)
	}
	if pools == "" {
		t.Fatal("no gdr-pools ConfigMap in the build")
	}
	// dispatch's ScaledObject reads Gitea's queue where KEDA (on the machine) reaches it, with a
	// trigger for each label of the test's pools, as deploy/README.md tells an operator to.
	for _, obj := range objs {
		if obj.GetKind() != "ScaledObject" {
			continue
		}
		if obj.GetName() == "dispatch" {
			wakeOnLabels(t, obj, config["GDR_GITEA_URL"], poolLabels(t, pools))
		}
		if o.alwaysUp {
			_ = unstructured.SetNestedField(obj.Object, int64(1), "spec", "minReplicaCount")
		}
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
	imported := []string{"dispatch", "handle", "recover", "gateway", "runner", "runner-host"}
	if o.build {
		imported = append(imported, "buildkit")
	}
	if o.docker {
		imported = append(imported, "docker")
	}
	if o.build || o.docker {
		runReadmeBuildBlock(ctx, t, c, "seccomp")
	}
	for _, name := range imported {
		if err := c.ImportImage(ctx, filepath.Join(images, name), "gdr.local/gitea-dynamic-runner-"+name); err != nil {
			t.Fatal(err)
		}
	}

	// The keys and Secrets (deploy/README.md, install step 1) and the runner registration.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: installNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitServiceAccount(ctx, t, installNamespace)
	// The executors' namespace: Pod Security restricted, as deploy/README.md labels it, when
	// executors get minted SVIDs (the default); with the Workload API not, the pools' Workload
	// API being a hostPath here (no CSI driver; TestE2EExecutorPodRestricted checks the
	// shipped template under restricted).
	jobsNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: jobsNamespace}}
	if o.podIdentity != backend.PodIdentityWorkloadAPI {
		jobsNS.Labels = podSecurityRestricted
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, jobsNS, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitServiceAccount(ctx, t, jobsNamespace)
	if o.build || o.docker { // deploy/README's "Image builds" or "Docker workflows": the namespace admits the sidecar
		want := podSecurityBuild
		if o.docker {
			runReadmeBlock(ctx, t, c, "docker", "namespace")
			want = podSecurityDocker
		} else {
			runReadmeBuildBlock(ctx, t, c, "namespace")
		}
		ns, err := cs.CoreV1().Namespaces().Get(ctx, jobsNamespace, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range want {
			if ns.Labels[k] != v {
				t.Fatalf("namespace %s labels %v after README's namespace block, want %v", jobsNamespace, ns.Labels, want)
			}
		}
		// The admission policy's parameters, as an operator edits them: the pools' images
		// and profiles (localPools), the missing one included, so that its Pod reaches the
		// kubelet (MissingProfile).
		params, err := cs.CoreV1().ConfigMaps(jobsNamespace).Get(ctx, "gdr-executors-build", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("README's namespace block: %v", err)
		}
		params.Data = map[string]string{"images": buildkitTestImage + "\n", "seccompProfiles": pod.DefaultBuildSeccompProfile + "\n" + missingSeccompProfile + "\n"}
		if o.docker {
			params.Data["dockerImages"] = dockerTestImageLocal + "\n"
		}
		if _, err := cs.CoreV1().ConfigMaps(jobsNamespace).Update(ctx, params, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	key := func(n int) []byte {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return []byte(base64.StdEncoding.EncodeToString(b))
	}
	seed := make([]byte, ed25519.SeedSize)
	_, _ = rand.Read(seed)
	verify := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	secrets := map[string]map[string][]byte{
		// KEDA reads Gitea's queue with it (deploy/README.md, install step 3).
		"gdr-gitea-read": {"token": []byte(g.CreateToken(t, "gdr-dispatch-wake", "read:admin"))},
	}
	for _, u := range natsUsers {
		data, err := os.ReadFile(nats.seeds[u])
		if err != nil {
			t.Fatal(err)
		}
		secrets["gdr-nats-"+strings.ReplaceAll(strings.ToLower(u), "_", "-")] = map[string][]byte{"nkey": data}
	}
	readToken := secrets["gdr-gitea-read"]["token"]
	if o.release != "" { // deploy/README.md's Helm blocks make both token Secrets
		delete(secrets, "gdr-gitea-read")
	} else if ca { // identity ca: the keys Job registers the pools, given Gitea's token
		secrets["gdr-registration-token"] = map[string][]byte{"token": []byte(g.RegistrationToken(t))}
	}
	if !ca {
		secrets["gdr-runner-credentials"] = registerPools(ctx, t, g, pools)
	}
	if !ca { // identity ca: the chart's keys Job makes them (read back after the install)
		secrets["gdr-secrets"] = map[string][]byte{
			"bootstrap-key": key(32), "payload-key": key(32), "webhook-secret": key(24), "tick-token": key(32),
			"assignment-signing-key": []byte(base64.StdEncoding.EncodeToString(seed)),
		}
	}
	for name, data := range secrets {
		if _, err := cs.CoreV1().Secrets(installNamespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CoreV1().Secrets(jobsNamespace).Create(ctx, &corev1.Secret{ // the executors' pull Secret
		ObjectMeta: metav1.ObjectMeta{Name: registrySecret}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: registry.DockerConfigJSON(registryHost)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !ca {
		if _, err := cs.CoreV1().ConfigMaps(installNamespace).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "gdr-assignment-verify-keys"},
			Data:       map[string]string{"verify-keys": base64.StdEncoding.EncodeToString(verify)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The registration entries of the gateway, handle and recover
	// (deploy/README.md): each one's ServiceAccount in this namespace, under
	// every node's agent (wherever the scheduler puts the Pod). None with
	// identity ca: no SPIRE.
	entries := map[spiffeid.ID]string{
		gatewayID: "gitea-dynamic-runner-gateway", handleID: "gitea-dynamic-runner-handle", recoverID: "gitea-dynamic-runner-recover",
	}
	if ca {
		entries = nil
	}
	for id, sa := range entries {
		for _, agentID := range agentIDs {
			resp, err := spire.Entries().BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*spiretypes.Entry{{
				SpiffeId: &spiretypes.SPIFFEID{TrustDomain: td.Name(), Path: id.Path()},
				ParentId: &spiretypes.SPIFFEID{TrustDomain: td.Name(), Path: agentID.Path()},
				Selectors: []*spiretypes.Selector{
					{Type: "k8s", Value: "ns:" + installNamespace},
					{Type: "k8s", Value: "sa:" + sa},
				},
			}}})
			if err != nil || resp.GetResults()[0].GetStatus().GetCode() != 0 {
				t.Fatalf("%s entry under %s: %v %v", sa, agentID, err, resp)
			}
		}
	}

	cacheDir := t.TempDir()
	if err := os.Chmod(cacheDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "gdr-cache-e2e"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("50Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: cacheDir}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: installNamespace, Name: "gdr-cache"},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// KEDA's operator (on the machine, its CRDs installed), then kubectl
	// apply -k keda (server-side apply).
	keda := kedaenv.Start(ctx, t, c.Plane.RESTConfig(), kedaenv.Options{WatchNamespace: installNamespace})
	var rel *releases
	var helm *readmeShell
	var applied []*unstructured.Unstructured
	switch o.how {
	case installKustomize:
		applyAll(ctx, t, c, objs)
		applied = objs
	case installHelm:
		vals := helmE2EValues(t, config, monitor, pools)
		if o.podIdentity != "" {
			vals["spire"].(map[string]any)["podIdentity"] = o.podIdentity
		}
		if ca {
			vals["identity"] = "ca"
			vals["gitea"].(map[string]any)["registrationTokenSecret"] = "gdr-registration-token"
		} else if probs := stepProblems(t, mustRenderChart(t, installNamespace, vals), unstructuredDocs(objs)); len(probs) > 0 {
			// The chart with these values renders what kubectl apply -k would apply here.
			t.Fatalf("the chart's objects are not the kustomize install's:\n%s", strings.Join(probs, "\n"))
		}
		if o.release == "" {
			helmInstall(ctx, t, c, nil, vals)
			break
		}
		// deploy/README.md's Helm install: the values its blocks set are not in my-values.yaml.
		rel = startReleases(t, c)
		rel.publish(ctx, t, o.release)
		helm = rel.helmShell(t, c, map[string]string{"VERSION": o.release, "GITEA": config["GDR_GITEA_URL"],
			"NATS": config["GDR_NATS_URL"], "NATS_MONITOR": monitor, "NATS_REPLICAS": config["GDR_NATS_REPLICAS"]})
		for _, k := range []string{"images", "gitea", "nats", "identity"} {
			delete(vals, k)
		}
		data, err := yaml.Marshal(vals)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(helm.dir, "my-values.yaml"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		in := &installation{helm: helm}
		in.helmBlock(ctx, t, "registration-token", g.RegistrationToken(t))
		in.helmBlock(ctx, t, "gitea-read-token", string(readToken))
		in.helmBlock(ctx, t, "install", "")
	}
	waitInstalled(ctx, t, c, cs, o.alwaysUp)
	if ca { // the keys Job's
		s, err := cs.CoreV1().Secrets(installNamespace).Get(ctx, "gdr-secrets", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the keys Job's gdr-secrets: %v", err)
		}
		secrets["gdr-secrets"] = s.Data
	}

	// Gitea's workflow_job webhook reaches dispatch serve as an operator
	// would expose it (here: a NodePort on the node's address, which the
	// machine reaches through the veth; kube-proxy forwards it).
	if _, err := cs.CoreV1().Services(installNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dispatch-webhook"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app.kubernetes.io/name": "dispatch", "app.kubernetes.io/component": "serve"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), NodePort: dispatchNodePort}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hook := g.AddSystemWebhook(t, fmt.Sprintf("http://%s/webhook", net.JoinHostPort(c.NodeIP(), fmt.Sprint(dispatchNodePort))),
		string(secrets["gdr-secrets"]["webhook-secret"]))
	return &installation{c: c, cs: cs, g: g, keda: keda, nats: nats, monitor: monitor, secrets: secrets, localize: localize, spire: spire, gitea: giteaAddr,
		registry: registry, registryHost: registryHost, webhook: hook, releases: rel, helm: helm, objs: applied}
}

// TestE2EClusterInstall runs real jobs through deploy/keda as installed by
// installKEDA: dispatch claims each (webhook), KEDA starts a handle Job for
// the assignment, handle creates the executor Pod (its SPIRE entry on this
// node's agent), the scheduler binds it, the kubelet runs it, the runner
// gets its SVID, reports through the gateway, and the job ends in Gitea as
// it should. Then the faults and the clean-up: a cancelled job's Pod goes
// within 30 s; a handle process SIGKILLed while it creates the executor
// costs AckWait and a redelivery to another handle, never the job or a
// second executor; an executor Pod deleted
// mid-job ends the job with the reason, and recover's manual Job cleans
// up after it; the recover CronJob's passes succeed; every dashboard query
// is fed by the metrics scraped from the install; recover status runs as
// its shipped Job; and at the end no
// handle Job or executor Pod runs (scale to zero) and no payload is left.
func TestE2EClusterInstall(t *testing.T) {
	ctx, cancel := clusterTest(t, 15*time.Minute)
	defer cancel()
	// The dashboard's step scrapes dispatch and the gateway after the jobs: both stay up.
	in := installKEDAWith(ctx, t, installOptions{alwaysUp: true})
	// Each scenario pushes to repositories of its own: a push runs every
	// workflow of its repository.
	in.runSteps(ctx, t, []step{
		{"Jobs", func(t *testing.T) { in.jobs(ctx, t) }},
		{"PrivateImageNotShared", func(t *testing.T) { in.privateImageNotShared(ctx, t) }},
		{"Cancel", func(t *testing.T) { in.cancel(ctx, t, in.g.CreateRepo(t, "cancel")) }},
		{"Cache", func(t *testing.T) { in.cache(ctx, t) }},
		{"HandleKilled", func(t *testing.T) { in.handleKilled(ctx, t, in.g.CreateRepo(t, "crash")) }},
		{"ExecutorEvicted", func(t *testing.T) { in.executorEvicted(ctx, t, in.g.CreateRepo(t, "evicted")) }},
		{"RecoverCronJob", func(t *testing.T) { in.recoverCronJob(ctx, t) }},
		{"Metrics", func(t *testing.T) { in.dashboardFed(ctx, t) }},
		{"RecoverStatus", func(t *testing.T) { in.recoverStatus(ctx, t) }},
		{"NothingLeft", func(t *testing.T) { in.nothingLeft(ctx, t) }},
	})
}

// step is one scenario of a cluster test, run as a subtest.
type step struct {
	name string
	run  func(t *testing.T)
}

// runSteps runs steps in order, each a subtest, and stops after the first that fails, with the
// installation's state dumped.
func (in *installation) runSteps(ctx context.Context, t *testing.T, steps []step) {
	t.Helper()
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			in.dump(ctx, t)
			return
		}
	}
}

// jobs pushes a plain job (the pool's runner-host image), a container: job
// (the runner injected into the job's image; here an image that has a
// shell, imported like the others: no registry) and a job with a service (a
// sidecar of its executor Pod, reached by its key) together: three runs,
// three executor Pods; each must end success with its step's output. Two
// more choose images the pool's images rule refuses (localPools): they must
// end failure with the rule in their log.
func (in *installation) jobs(ctx context.Context, t *testing.T) {
	cases := []struct{ name, workflow, want, conclusion string }{
		{"hello", `on: push
jobs:
  hello:
    runs-on: ubuntu-latest
    steps:
      - run: echo "hello from $(cat /etc/hostname) as $(id -u)"
`, "hello from gdr-linux-", ""},
		{"boxed", `on: push
jobs:
  boxed:
    runs-on: ubuntu-latest
    container: gdr.local/gitea-dynamic-runner-runner-host:latest
    steps:
      - run: echo "boxed in $(cat /etc/hostname)"
`, "boxed in gdr-linux-", ""},
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
`, "the service said: echo: ping", ""},
		{"foreign", `on: push
jobs:
  foreign:
    runs-on: ubuntu-latest
    container: registry.example.com/tenant-b/private:1
    steps:
      - run: echo "must not run"
`, `container image "registry.example.com/tenant-b/private:1": image not allowed: it matches none of the runner pool's images.allowed [gdr.local/**, `, "failure"},
		{"foreignsvc", `on: push
jobs:
  foreignsvc:
    runs-on: ubuntu-latest
    services:
      db:
        image: gdr.local/gitea-dynamic-runner-runner-host:latest
    steps:
      - run: echo "must not run"
`, `service db: image "gdr.local/gitea-dynamic-runner-runner-host:latest": image not allowed: it matches none of the runner pool's images.services [gdr.local/echo:*]`, "failure"},
	}
	repos := map[string]string{}
	for _, tc := range cases {
		repos[tc.name] = in.g.CreateRepo(t, tc.name)
	}
	t0 := time.Now()
	for _, tc := range cases {
		in.g.PushWorkflow(t, repos[tc.name], ".gitea/workflows/"+tc.name+".yml", tc.workflow)
	}
	for _, tc := range cases {
		repo := repos[tc.name]
		job := in.waitCompleted(ctx, t, repo, tc.name, 5*time.Minute)
		if want := cmp.Or(tc.conclusion, "success"); job.Conclusion != want {
			t.Fatalf("job %+v, want completed %s", job, want)
		}
		log := in.g.JobLogs(t, repo, job.ID)
		if !strings.Contains(log, tc.want) {
			t.Fatalf("job %s's log lacks %q:\n%s", job.Name, tc.want, log)
		}
		if strings.Contains(log, "must not run") {
			t.Fatalf("job %s ran a step with a refused image:\n%s", job.Name, log)
		}
		t.Logf("job %s %s, seen %v after the pushes", tc.name, job.Conclusion, time.Since(t0).Round(time.Millisecond))
	}
}

// privateImageNotShared: the pool linux runs a job in a private image it
// has the pull secret for, which leaves the image in the node's cache. A job
// of the pool tenant-lax (pullPolicy IfNotPresent, no secret) then runs it
// from the cache without the registry ever being asked: the leak the pull
// policy exists for, on a kubelet that does not verify cached images'
// credentials (clusterenv's: imagePullCredentialsVerificationPolicy
// NeverVerify, as before Kubernetes' KEP-2535). A job of the pool tenant-b
// (the default, Always; no secret) makes the node ask the registry without
// credentials, is refused, and ends failure with the image pull in its log,
// its step never run.
func (in *installation) privateImageNotShared(ctx context.Context, t *testing.T) {
	image := in.registryHost + "/" + privateImage
	workflow := func(pool string) string {
		return `on: push
jobs:
  private:
    runs-on: ` + pool + `
    container: ` + image + `
    steps:
      - run: echo "private image ran in $(cat /etc/hostname)"
`
	}
	requests := func() (with, without int) {
		for _, r := range in.registry.ManifestRequests() {
			if r.Authenticated {
				with++
			} else {
				without++
			}
		}
		return with, without
	}
	run := func(pool string, timeout time.Duration) (giteaenv.Job, string) {
		repo := in.g.CreateRepo(t, "private-"+pool)
		in.g.PushWorkflow(t, repo, ".gitea/workflows/private.yml", workflow(pool))
		job := in.waitCompleted(ctx, t, repo, "private", timeout)
		return job, in.g.JobLogs(t, repo, job.ID)
	}

	job, log := run("ubuntu-latest", 5*time.Minute)
	if job.Conclusion != "success" || !strings.Contains(log, "private image ran in gdr-linux-") {
		t.Fatalf("the pool with the pull secret: job %+v, log:\n%s", job, log)
	}
	if with, _ := requests(); with == 0 {
		t.Fatal("the private image ran, but the registry served no authenticated manifest request")
	}

	// The precondition of the leak: the image is in the node's cache, and a
	// pool without credentials that trusts the cache runs it.
	withBefore, withoutBefore := requests()
	job, log = run("tenant-lax", 5*time.Minute)
	if job.Conclusion != "success" || !strings.Contains(log, "private image ran in gdr-tenant-lax-") {
		t.Fatalf("tenant-lax (IfNotPresent) did not run the cached image: job %+v, log:\n%s", job, log)
	}
	if with, without := requests(); with != withBefore || without != withoutBefore {
		t.Fatalf("tenant-lax asked the registry (%d/%d manifest requests, were %d/%d): the cache was not what ran", with, without, withBefore, withoutBefore)
	}

	job, log = run("tenant-b", 8*time.Minute)
	_, withoutAfter := requests()
	if withoutAfter == withoutBefore {
		t.Fatalf("tenant-b's node never asked the registry without credentials (job %+v): Always did not reach the registry", job)
	}
	if job.Conclusion != "failure" || !strings.Contains(log, "ImagePull") || strings.Contains(log, "private image ran in") {
		t.Fatalf("tenant-b (Always, no secret) ran or did not fail on the pull: job %+v, log:\n%s", job, log)
	}
	t.Logf("tenant-b refused by the registry (%d unauthenticated manifest requests); its job failed with the pull in its log", withoutAfter-withoutBefore)
}

// cache runs actions/cache@v4 (the real action, hosted by this Gitea) in
// two executor Pods one after the other: the second restores what the
// first saved, through each runner's loopback proxy and the gateway's cache
// on its PersistentVolume (components/cache).
func (in *installation) cache(ctx context.Context, t *testing.T) {
	in.g.HostAction(t, giteaenv.VendoredAction("cache-v4"), "actions", "cache", "v4")
	repo := in.g.CreateRepo(t, "cached")
	content := fmt.Sprintf("built-%d", time.Now().UnixNano())
	in.g.PushWorkflow(t, repo, ".gitea/workflows/cache.yml", `on: push
jobs:
  save:
    runs-on: ubuntu-latest
    steps:
      - run: mkdir -p deps && echo `+content+` > deps/out.txt
      - uses: actions/cache@v4
        with:
          path: deps
          key: deps-v1
  restore:
    needs: save
    runs-on: ubuntu-latest
    steps:
      - uses: actions/cache@v4
        id: cache
        with:
          path: deps
          key: deps-v1
          fail-on-cache-miss: true
      - run: echo "hit=${{ steps.cache.outputs.cache-hit }} content=$(cat deps/out.txt) in $(cat /etc/hostname)"
`)
	for _, name := range []string{"save", "restore"} {
		job := in.waitCompleted(ctx, t, repo, name, 5*time.Minute)
		log := in.g.JobLogs(t, repo, job.ID)
		if job.Conclusion != "success" {
			t.Fatalf("job %s: %+v, log:\n%s", name, job, log)
		}
		if name == "restore" && !strings.Contains(log, "hit=true content="+content+" in gdr-linux-") {
			t.Fatalf("job restore did not restore the saved entry; log:\n%s", log)
		}
	}
}

// cancel cancels a running job in Gitea: the runner hears it through the
// gateway, ends, and its executor Pod must be gone within 30 s (the
// finish notice's recover-finish Job deletes it).
func (in *installation) cancel(ctx context.Context, t *testing.T, repo string) {
	in.g.PushWorkflow(t, repo, ".gitea/workflows/long.yml", `on: push
jobs:
  long:
    runs-on: ubuntu-latest
    steps:
      - run: echo started; sleep 600
`)
	job := in.g.WaitJob(t, repo, func(j giteaenv.Job) bool { return j.Name == "long" && stepRunning(j) }, 3*time.Minute)
	pod := in.executorPod(ctx, t, repo)
	in.g.CancelRun(t, repo, job.RunID)
	t0 := time.Now()
	in.waitPodGone(ctx, t, pod, 30*time.Second)
	t.Logf("cancelled job's executor Pod %s gone %v after the cancel", pod, time.Since(t0).Round(time.Millisecond))
	if job := in.waitCompleted(ctx, t, repo, "long", time.Minute); job.Conclusion != "cancelled" {
		t.Fatalf("job %+v, want cancelled", job)
	}
}

// runningHandles names the handle-pod Pods that are running (not
// handle-setup's, not finished ones).
func (in *installation) runningHandles(ctx context.Context, t testing.TB) []string {
	pods, err := in.cs.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=handle"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && p.Labels["batch.kubernetes.io/job-name"] != "handle-setup" {
			names = append(names, p.Name)
		}
	}
	return names
}

// acceptedAfter returns the handle Pod, not among killed, whose log shows that it accepted
// assignment at or after at (the line's own time); "" if none. Not "created after at": with
// lingering handles, a Job KEDA started while the killed one held the message may be the one
// that takes it back, started before the kill and running only after it.
func (in *installation) acceptedAfter(ctx context.Context, assignment string, at time.Time, killed []string) string {
	pods, err := in.cs.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=handle"})
	if err != nil {
		return ""
	}
	for _, p := range pods.Items {
		if slices.Contains(killed, p.Name) {
			continue
		}
		log, err := in.cs.CoreV1().Pods(installNamespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			continue // not started, or already gone
		}
		for _, line := range strings.Split(string(log), "\n") {
			var entry struct {
				Time       time.Time `json:"time"`
				Msg        string    `json:"msg"`
				Assignment string    `json:"assignment"`
			}
			if json.Unmarshal([]byte(line), &entry) != nil {
				continue
			}
			if entry.Msg == "assignment accepted" && entry.Assignment == assignment && !entry.Time.Before(at) {
				return p.Name
			}
		}
	}
	return ""
}

// executorEvicted deletes a running job's executor Pod as `kubectl delete
// pod` or a node drain would (SIGTERM, then the grace period): the runner
// ends the job in Gitea with the reason, and recover's manual Job
// (deploy/keda/manual/recover-now.yaml, created as an operator would, run
// as its shipped ServiceAccount and NATS user) then finds the payload of a
// task Gitea has ended and no executor, and deletes it.
func (in *installation) executorEvicted(ctx context.Context, t *testing.T, repo string) {
	// The CronJob's passes would do the clean-up too; suspended, so that
	// the manual Job is the one that must.
	in.suspendCronJob(ctx, t, "recover", true)
	defer in.suspendCronJob(ctx, t, "recover", false)
	// So is recover's fast path: the runner's final report publishes a finish notice, and a
	// recover-finish Job that still finds the terminating Pod finishes it and deletes the
	// payload before the manual Job runs (CI saw it). The notice waits in its stream.
	in.pauseScaledJob(ctx, t, "recover-finish", true)
	defer in.pauseScaledJob(ctx, t, "recover-finish", false)
	in.g.PushWorkflow(t, repo, ".gitea/workflows/evicted.yml", `on: push
jobs:
  evicted:
    runs-on: ubuntu-latest
    steps:
      - run: echo "started in $(cat /etc/hostname)"; sleep 120; echo survived
`)
	in.g.WaitJob(t, repo, func(j giteaenv.Job) bool { return j.Name == "evicted" && stepRunning(j) }, 3*time.Minute)
	pod := in.executorPod(ctx, t, repo)
	p, err := in.cs.CoreV1().Pods(jobsNamespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	assignment := p.Labels["gitea-dynamic-runner.io/assignment-id"]
	// A voluntary eviction (kubectl drain, a scale-down) is refused while the job runs: the
	// executors' PodDisruptionBudget; the cluster autoscaler is told so too.
	if p.Annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] != "false" {
		t.Errorf("executor Pod %s annotations %v: the cluster autoscaler may evict it", pod, p.Annotations)
	}
	// The budget as the disruption controller computed it (an unobserved one answers 429 too,
	// which would prove only that it exists): no disruption allowed.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		pdb, err := in.cs.PolicyV1().PodDisruptionBudgets(jobsNamespace).Get(ctx, "gdr-executors", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.CurrentHealthy > 0 {
			if pdb.Status.DisruptionsAllowed != 0 {
				t.Fatalf("executors' budget allows %d disruptions: %+v", pdb.Status.DisruptionsAllowed, pdb.Status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("executors' budget not computed by the disruption controller: %+v", pdb.Status)
		}
	}
	err = in.cs.PolicyV1().Evictions(jobsNamespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: jobsNamespace}})
	if !apierrors.IsTooManyRequests(err) {
		t.Fatalf("evicting running executor Pod %s: %v, want 429 (its disruption budget)", pod, err)
	}
	if again, err := in.cs.CoreV1().Pods(jobsNamespace).Get(ctx, pod, metav1.GetOptions{}); err != nil || again.DeletionTimestamp != nil {
		t.Fatalf("executor Pod %s after a refused eviction: %v, deleting %v", pod, err, again.DeletionTimestamp)
	}
	t.Logf("eviction of running executor Pod %s refused: %v", pod, err)
	// A forced drain deletes it (kubectl drain --disable-eviction, kubectl delete pod).
	if err := in.cs.CoreV1().Pods(jobsNamespace).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	job := in.waitCompleted(ctx, t, repo, "evicted", 2*time.Minute)
	log := in.g.JobLogs(t, repo, job.ID)
	t.Logf("evicted job: %s; its log ends:\n%s", job.Conclusion, tail(log, 6))
	if job.Conclusion == "success" || regexp.MustCompile(`(?m)Z survived$`).MatchString(log) {
		t.Fatalf("job %+v ran on after its executor was deleted", job)
	}
	in.waitPodGone(ctx, t, pod, time.Minute)
	// The fault the manual Job must clean up: the payload of an ended task
	// with no executor, still there when it runs (the CronJob suspended).
	if ids := in.payloadIDs(ctx, t); !slices.Contains(ids, assignment) {
		t.Fatalf("payload of %s already gone before the recover Job (payloads: %v): the Job would prove nothing", assignment, ids)
	}
	name := in.runManualRecover(ctx, t)
	t.Logf("recover Job %s:\n%s", name, in.jobLogs(ctx, t, name))
	if ids := in.payloadIDs(ctx, t); slices.Contains(ids, assignment) {
		t.Fatalf("payload of %s left after the recover pass (payloads: %v)", assignment, ids)
	}
}

// payloadIDs lists the payloads in the bucket, as recover does.
func (in *installation) payloadIDs(ctx context.Context, t *testing.T) []string {
	t.Helper()
	rc := in.nats.connect(t, "RECOVER")
	var key secretkey.Key
	if err := key.Decode(string(in.secrets["gdr-secrets"]["payload-key"])); err != nil {
		t.Fatal(err)
	}
	payloads, err := assignmentqueue.OpenPayloads(ctx, rc.js, "CI_TASKS", key)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := payloads.IDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// suspendCronJob sets the CronJob name's suspend flag; when suspending, it
// waits until none of its Jobs is active.
func (in *installation) suspendCronJob(ctx context.Context, t *testing.T, name string, suspend bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"suspend":%t}}`, suspend)
	if _, err := in.cs.BatchV1().CronJobs(installNamespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); suspend; time.Sleep(time.Second) {
		cj, err := in.cs.BatchV1().CronJobs(installNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(cj.Status.Active) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CronJob %s still has active Jobs: %v", name, cj.Status.Active)
		}
	}
}

// pauseScaledJob sets or removes KEDA's pause annotation on the ScaledJob name; when
// pausing, it waits until KEDA reports it paused and none of its Jobs is active, so that no
// Job of it starts or runs after it returns.
func (in *installation) pauseScaledJob(ctx context.Context, t *testing.T, name string, pause bool) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(in.c.Plane.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	sj := dyn.Resource(schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledjobs"}).Namespace(installNamespace)
	patch := `{"metadata":{"annotations":{"autoscaling.keda.sh/paused":null}}}`
	if pause {
		patch = `{"metadata":{"annotations":{"autoscaling.keda.sh/paused":"true"}}}`
	}
	if _, err := sj.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); pause; time.Sleep(time.Second) {
		obj, err := sj.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
		paused := slices.ContainsFunc(conds, func(c any) bool {
			m, _ := c.(map[string]any)
			return m["type"] == "Paused" && m["status"] == "True"
		})
		jobs, err := in.cs.BatchV1().Jobs(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: "scaledjob.keda.sh/name=" + name})
		if err != nil {
			t.Fatal(err)
		}
		active := slices.ContainsFunc(jobs.Items, func(j batchv1.Job) bool {
			return !slices.ContainsFunc(j.Status.Conditions, func(c batchv1.JobCondition) bool {
				return (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue
			})
		})
		if paused && !active {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ScaledJob %s: paused %v, Jobs active %v after 2 min", name, paused, active)
		}
	}
}

// recoverCronJob waits for a Job of the shipped recover CronJob (every
// 5 minutes) to succeed: a whole pass as recover's ServiceAccount and NATS
// user, on the cluster's own schedule.
func (in *installation) recoverCronJob(ctx context.Context, t *testing.T) {
	for deadline := time.Now().Add(6 * time.Minute); ; time.Sleep(2 * time.Second) {
		jobs, err := in.cs.BatchV1().Jobs(installNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs.Items {
			if !ownedBy(j.OwnerReferences, "CronJob", "recover") {
				continue
			}
			if j.Status.Failed > 0 {
				t.Fatalf("recover CronJob's Job %s failed:\n%s", j.Name, in.jobLogs(ctx, t, j.Name))
			}
			if j.Status.Succeeded > 0 {
				t.Logf("recover CronJob's Job %s succeeded", j.Name)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no Job of the recover CronJob succeeded within 6 minutes")
		}
	}
}

// recoverNow starts a pass of recover now, as an operator's `kubectl create job
// --from=cronjob/recover` does: a Job of the CronJob's template, owned by it (so recoverPass
// knows its Pod), instead of waiting up to 5 minutes for the schedule.
func (in *installation) recoverNow(ctx context.Context, t *testing.T) {
	t.Helper()
	cj, err := in.cs.BatchV1().CronJobs(installNamespace).Get(ctx, "recover", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "recover-now-", Namespace: installNamespace,
			Labels:          cj.Spec.JobTemplate.Labels,
			Annotations:     map[string]string{"cronjob.kubernetes.io/instantiate": "manual"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))},
		},
		Spec: cj.Spec.JobTemplate.Spec,
	}
	if job, err = in.cs.BatchV1().Jobs(installNamespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("recover pass started now: Job %s", job.Name)
}

// nothingLeft checks what the jobs leave: no executor or handle Pod
// running (the control plane aside) and no payload in the bucket.
func (in *installation) nothingLeft(ctx context.Context, t *testing.T) {
	t1 := time.Now()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		var pods []corev1.Pod
		for _, ns := range []string{installNamespace, jobsNamespace} {
			list, err := in.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pods = append(pods, list.Items...)
		}
		var left []string
		for _, p := range pods {
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue // a finished Job's Pod, kept as history
			}
			name := p.Labels["app.kubernetes.io/name"]
			if name == "dispatch" || name == "gateway" {
				continue // the long-running control plane
			}
			if name == "recover" && !strings.HasPrefix(p.Name, "recover-finish") {
				continue // a CronJob pass that happens to run now
			}
			left = append(left, p.Name+" ("+string(p.Status.Phase)+")")
		}
		if len(left) == 0 {
			t.Logf("no executor or handle Pod left %v after the jobs ended", time.Since(t1).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left running after the jobs: %v", left)
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		ids := in.payloadIDs(ctx, t)
		if len(ids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("payloads left after every job ended: %v", ids)
		}
	}
}

// stepRunning reports whether j's first step has started.
func stepRunning(j giteaenv.Job) bool {
	return len(j.Steps) > 0 && j.Steps[0].Status != "" && j.Steps[0].Status != "queued"
}

// waitCompleted waits for the job named name to be completed and returns it.
func (in *installation) waitCompleted(ctx context.Context, t testing.TB, repo, name string, timeout time.Duration) giteaenv.Job {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(500 * time.Millisecond) {
		for _, j := range in.g.Jobs(t, repo) {
			if j.Name == name && j.Status == "completed" {
				return j
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			in.dump(ctx, t)
			t.Fatalf("job %s not completed after %v", name, timeout)
		}
	}
}

// executorSelector selects every executor Pod, and repositoryAnnotation
// names an executor's repository (the default metadata prefix).
const (
	executorSelector     = "gitea-dynamic-runner.io/runner=true"
	repositoryAnnotation = "gitea-dynamic-runner.io/repository"
)

// executorPod returns the name of the one running executor Pod of repo.
func (in *installation) executorPod(ctx context.Context, t *testing.T, repo string) string {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		pods, err := in.cs.CoreV1().Pods(jobsNamespace).List(ctx, metav1.ListOptions{LabelSelector: executorSelector})
		if err != nil {
			t.Fatal(err)
		}
		var running []string
		for _, p := range pods.Items {
			if p.Annotations[repositoryAnnotation] == repo && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running = append(running, p.Name)
			}
		}
		if len(running) == 1 {
			return running[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("running executor Pods: %v, want exactly one", running)
		}
	}
}

// waitPodGone waits until the executor Pod name no longer exists.
func (in *installation) waitPodGone(ctx context.Context, t *testing.T, name string, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(250 * time.Millisecond) {
		_, err := in.cs.CoreV1().Pods(jobsNamespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			in.dump(ctx, t)
			t.Fatalf("Pod %s still there %v later", name, timeout)
		}
	}
}

// runManualRecover creates deploy/keda/manual/recover-now.yaml as an
// operator would (kubectl create) and waits for its Job to complete; it
// returns the Job's name.
func (in *installation) runManualRecover(ctx context.Context, t *testing.T) string {
	t.Helper()
	return in.runManualJob(ctx, t, "recover-now.yaml")
}

// jobLogs returns the logs of the Pods of the Job name.
func (in *installation) jobLogs(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	pods, err := in.cs.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, p := range pods.Items {
		raw, err := in.cs.CoreV1().Pods(installNamespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		fmt.Fprintf(&b, "--- %s (%v)\n%s", p.Name, err, raw)
	}
	return b.String()
}

// dump logs every Pod's status and log tail and KEDA's log tail.
func (in *installation) dump(ctx context.Context, t testing.TB) {
	dumpPods(ctx, t, in.cs)
	t.Logf("keda-operator log:\n%s", in.keda.LogTail(40))
}

func ownedBy(refs []metav1.OwnerReference, kind, name string) bool {
	for _, r := range refs {
		if r.Kind == kind && r.Name == name {
			return true
		}
	}
	return false
}

// gatewayClusterIP is the gateway Service's ClusterIP in the install test
// (the cluster has no DNS to resolve "gateway").
const gatewayClusterIP = "10.0.0.200"

// dispatchNodePort is where Gitea's webhooks reach dispatch serve.
const dispatchNodePort = 30080

// localPools rewrites the pools file of the gdr-pools ConfigMap obj for this
// cluster: the executor images are the imported ones (IfNotPresent, the
// template's and, through the pool's images.pullPolicy, the jobs'), and the
// Workload API comes from the agent's socket folder by hostPath. The pool
// linux may pull from the private registry at registry (its template names
// the pull secret gdr-registry); two more pools, copies of linux without that
// secret, serve the private-image test: tenant-b pulls job images Always
// (the default), tenant-lax IfNotPresent; edit, if not nil, edits linux's
// Pod template spec last; with build, copies of linux called build and build-noprofile get the
// build capability (the buildkit image), build-noprofile with a seccomp profile no node has
// (missingSeccompProfile); with docker, copies of linux called docker and docker-userns get
// the docker capability (the docker image), docker-userns with its user namespace. It returns the rewritten file.
func localPools(t testing.TB, obj *unstructured.Unstructured, registry string, o installOptions) string {
	edit, build := o.podTemplate, o.build
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
	list, _ := pools["pools"].([]any)
	if len(list) != 1 {
		t.Fatalf("the shipped pools file has %d pools, want linux alone", len(list))
	}
	linux := list[0].(map[string]any)
	copyOf := func(name, pull string) map[string]any {
		var c map[string]any
		b, _ := json.Marshal(linux)
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		c["name"], c["labels"] = name, []any{name}
		// No registry here: the jobs' imported images (echo, the container
		// job's) need IfNotPresent in linux. The rule admits exactly what the
		// jobs test runs and refuses its two foreign-image jobs.
		c["images"] = map[string]any{"pullPolicy": pull,
			"allowed": []any{"gdr.local/**", registry + "/**"}, "services": []any{"gdr.local/echo:*"}}
		return c
	}
	tenantB, lax := copyOf("tenant-b", "Always"), copyOf("tenant-lax", "IfNotPresent")
	linux["images"] = copyOf("linux", "IfNotPresent")["images"]
	spec, _, _ := unstructured.NestedMap(linux, "profile", "podTemplate", "spec")
	spec["imagePullSecrets"] = []any{map[string]any{"name": registrySecret}}
	if edit != nil {
		edit(spec)
	}
	if err := unstructured.SetNestedMap(linux, spec, "profile", "podTemplate", "spec"); err != nil {
		t.Fatal(err)
	}
	if o.capacity > 0 {
		linux["capacity"] = o.capacity
	}
	pools["pools"] = []any{linux, tenantB, lax}
	if build {
		for name, profile := range map[string]string{"build": "", "build-noprofile": missingSeccompProfile} {
			b := copyOf(name, "IfNotPresent")
			// The test node has 2 cores: the sidecars of the build tests'
			// executors (several at once) request little CPU; the limits stay.
			settings := map[string]any{"image": buildkitTestImage,
				"resources": map[string]any{"requests": map[string]any{"cpu": "50m", "memory": "1Gi"},
					"limits": map[string]any{"cpu": "2", "memory": "1Gi"}}}
			if profile != "" {
				settings["seccompProfile"] = profile
			}
			b["profile"].(map[string]any)["build"] = settings
			pools["pools"] = append(pools["pools"].([]any), b)
		}
	}
	if o.docker {
		for name, userns := range map[string]bool{"docker": false, "docker-userns": true} {
			d := copyOf(name, "IfNotPresent")
			// The node has 2 cores and the test's jobs run one at a time: a small request.
			settings := map[string]any{"image": dockerTestImageLocal,
				"resources": map[string]any{"requests": map[string]any{"cpu": "50m", "memory": "1Gi"},
					"limits": map[string]any{"cpu": "2", "memory": "2Gi"}}}
			if userns {
				settings["userNamespace"] = true
			}
			d["profile"].(map[string]any)["docker"] = settings
			pools["pools"] = append(pools["pools"].([]any), d)
		}
	}
	out, err := yaml.Marshal(pools)
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(obj.Object, string(out), "data", "pools.yaml"); err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// buildkitTestImage is the build pools' buildkit image: make images' buildkit, imported.
const buildkitTestImage = "gdr.local/gitea-dynamic-runner-buildkit:latest"

// dockerTestImageLocal is the docker pool's docker image: make images' docker, imported.
const dockerTestImageLocal = "gdr.local/gitea-dynamic-runner-docker:latest"

// registrySecret is the pull secret of the pool linux for the private
// registry (registryenv).
const registrySecret = "gdr-registry"

// privateImage is the image only the pool linux may pull.
const privateImage = "tenant-a/private:1"

// imagesFolder is `make images`' output (bin/images), or the test is
// unavailable (skipped on a developer machine, failed under CI=true).
func imagesFolder(t testing.TB) string {
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
func registerPools(ctx context.Context, t testing.TB, g *giteaenv.Server, poolsYAML string) map[string][]byte {
	t.Helper()
	state := t.TempDir()
	file := filepath.Join(t.TempDir(), "pools.yaml")
	if err := os.WriteFile(file, []byte(poolsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	pools, err := runnerpool.PoolSettings{PoolsFile: file, StateDir: state}.Load()
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
func applyAll(ctx context.Context, t testing.TB, c *clusterenv.Cluster, objs []*unstructured.Unstructured) {
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
		// kubectl apply --server-side's own field manager: an operator's later apply of the same
		// objects (an upgrade, OPERATIONS' nats-lost converge) co-owns every field as after a
		// first kubectl apply; under another manager, a field the API server stores differently
		// from the applied value (an empty list stored as none) would conflict.
		if _, err := res.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "kubectl", Force: true}); err != nil {
			t.Fatalf("apply %s %s: %v", gvk.Kind, obj.GetName(), err)
		}
	}
}

// waitInstalled waits for the handle-setup Job to complete and the dispatch
// and gateway Deployments to be available, and on failure dumps every Pod's
// status and log.
func waitInstalled(ctx context.Context, t testing.TB, c *clusterenv.Cluster, cs kubernetes.Interface, up bool) {
	t.Helper()
	t0 := time.Now()
	done := map[string]time.Duration{}
	dyn, err := dynamic.NewForConfig(c.Plane.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	scaledObjects := dyn.Resource(schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledobjects"}).Namespace(installNamespace)
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
			// KEDA reads the ScaledObject's triggers (Ready), and with alwaysUp its replica is up.
			so, err := scaledObjects.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(so.Object, "status", "conditions")
			ready := false
			for _, cond := range conds {
				if m, _ := cond.(map[string]any); m["type"] == "Ready" && m["status"] == "True" {
					ready = true
				}
			}
			if !ready {
				continue
			}
			d, err := cs.AppsV1().Deployments(installNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if !up {
				done[name] = time.Since(t0)
				continue
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
			for _, name := range []string{"dispatch", "gateway"} {
				if so, err := scaledObjects.Get(ctx, name, metav1.GetOptions{}); err == nil {
					conds, _, _ := unstructured.NestedSlice(so.Object, "status", "conditions")
					t.Logf("ScaledObject %s: %v", name, conds)
				}
			}
			t.Fatalf("install not up (%v; done: %v)", err, done)
		}
		time.Sleep(time.Second)
	}
}

// poolLabels returns every label of the pools file text, each once, in order.
func poolLabels(t testing.TB, text string) []string {
	t.Helper()
	var file struct {
		Pools []struct {
			Labels []string `json:"labels"`
		} `json:"pools"`
	}
	if err := yaml.Unmarshal([]byte(text), &file); err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, p := range file.Pools {
		for _, l := range p.Labels {
			if !slices.Contains(labels, l) {
				labels = append(labels, l)
			}
		}
	}
	return labels
}

// wakeOnLabels points the ScaledObject dispatch's Gitea trigger (the shipped one, for
// ubuntu-latest) at gitea (its root URL) and gives it a copy for each other of labels.
func wakeOnLabels(t testing.TB, obj *unstructured.Unstructured, gitea string, labels []string) {
	t.Helper()
	triggers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "triggers")
	var shipped map[string]any
	for _, tr := range triggers {
		if m := tr.(map[string]any); m["type"] == "metrics-api" {
			shipped = m
		}
	}
	if shipped == nil {
		t.Fatal("ScaledObject dispatch has no metrics-api trigger")
	}
	md := shipped["metadata"].(map[string]any)
	const placeholder = "https://gitea.example.com/"
	u, _ := md["url"].(string)
	if !strings.HasPrefix(u, placeholder) {
		t.Fatalf("dispatch's Gitea trigger reads %q, not under the placeholder %s", u, placeholder)
	}
	md["url"] = gitea + strings.TrimPrefix(u, placeholder)
	const shippedLabel = "ubuntu-latest"
	loc := fmt.Sprintf("jobs.#(labels.#(==%q))#|#", shippedLabel)
	if md["valueLocation"] != loc {
		t.Fatalf("dispatch's Gitea trigger counts %v, want %s", md["valueLocation"], loc)
	}
	for _, l := range labels {
		if l == shippedLabel {
			continue
		}
		c := runtime.DeepCopyJSONValue(shipped).(map[string]any)
		c["metadata"].(map[string]any)["valueLocation"] = fmt.Sprintf("jobs.#(labels.#(==%q))#|#", l)
		triggers = append(triggers, c)
	}
	if err := unstructured.SetNestedSlice(obj.Object, triggers, "spec", "triggers"); err != nil {
		t.Fatal(err)
	}
}

func dumpPods(ctx context.Context, t testing.TB, cs kubernetes.Interface) {
	t.Helper()
	for _, ns := range []string{installNamespace, jobsNamespace} {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Logf("list pods of %s: %v", ns, err)
			continue
		}
		for _, p := range pods.Items {
			t.Logf("pod %s/%s: %s %+v", ns, p.Name, p.Status.Phase, p.Status.ContainerStatuses)
			for _, ctr := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				b, err := cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr.Name, TailLines: ptrTo(int64(30))}).DoRaw(ctx)
				t.Logf("--- %s/%s log (%v):\n%s", p.Name, ctr.Name, err, b)
			}
		}
	}
}

func ptrTo[T any](v T) *T { return &v }
