//go:build e2e

package deploy

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/kube"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

// helmRelease is the release name of the chart in the cluster tests.
const helmRelease = "gdr"

// helmE2EValues are the chart's values that give the objects installKEDAWith applies with
// kustomize: config is what it sets in gdr-config, monitor NATS' monitoring address, pools the
// pools file (localPools). Everything else the test cluster needs (images imported, no CSI
// driver, a fixed gateway address) is a value too.
func helmE2EValues(t testing.TB, config map[string]string, monitor, pools string) map[string]any {
	t.Helper()
	var p struct {
		Pools []any `json:"pools"`
	}
	if err := yaml.Unmarshal([]byte(pools), &p); err != nil {
		t.Fatal(err)
	}
	replicas := map[string]int{"1": 1, "3": 3, "5": 5}[config["GDR_NATS_REPLICAS"]]
	return map[string]any{
		"images": map[string]any{"registry": "gdr.local", "tag": "latest", "pullPolicy": "IfNotPresent"},
		"gitea":  map[string]any{"url": config["GDR_GITEA_URL"]},
		"nats":   map[string]any{"url": config["GDR_NATS_URL"], "replicas": replicas, "monitoringEndpoint": monitor},
		"spire": map[string]any{
			"trustDomain": config["GDR_TRUST_DOMAIN"], "clusterName": config["GDR_CLUSTER_NAME"],
			"server": config["GDR_SPIRE_SERVER"], "gatewaySpiffeID": config["GDR_GATEWAY_SPIFFE_ID"],
			"workloadAPI": map[string]any{"csiDriver": "", "hostPath": clusterenv.SPIREAgentSocketDir},
		},
		"gateway": map[string]any{"url": config["GDR_GATEWAY_URL"], "service": map[string]any{"clusterIP": gatewayClusterIP}},
		"cache":   map[string]any{"enabled": true},
		"pools":   p.Pools,
	}
}

// unstructuredDocs wraps objects as documents for stepProblems.
func unstructuredDocs(objs []*unstructured.Unstructured) []doc {
	docs := make([]doc, 0, len(objs))
	for _, o := range objs {
		docs = append(docs, doc{file: "kustomize", obj: o.Object})
	}
	return docs
}

// helmConfig is Helm's action configuration for the cluster's namespace installNamespace, as
// the cluster's admin (releases stored as Secrets, Helm's default).
func helmConfig(t testing.TB, c *clusterenv.Cluster) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	kubeconfig, ns := c.AdminKubeconfig(), installNamespace
	flags.KubeConfig, flags.Namespace = &kubeconfig, &ns
	cfg := action.NewConfiguration()
	if err := cfg.Init(flags, installNamespace, "secret"); err != nil {
		t.Fatalf("helm: %v", err)
	}
	return cfg
}

// loadChart is chrt, or the chart of chartDir when chrt is nil.
func loadChart(t testing.TB, chrt chart.Charter) chart.Charter {
	t.Helper()
	if chrt != nil {
		return chrt
	}
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return chrt
}

// helmInstall runs helm install of chrt (nil: chartDir's) with vals into installNamespace
// (server-side apply, Helm v4's default; no wait: installKEDAWith waits as for kubectl apply).
func helmInstall(ctx context.Context, t testing.TB, c *clusterenv.Cluster, chrt chart.Charter, vals map[string]any) {
	t.Helper()
	chrt = loadChart(t, chrt)
	install := action.NewInstall(helmConfig(t, c))
	install.ReleaseName = helmRelease
	install.Namespace = installNamespace
	install.WaitStrategy = kube.HookOnlyStrategy // the CLI's default without --wait: the chart has no install hooks (its one hook is helm test's)
	t0 := time.Now()
	if _, err := install.RunWithContext(ctx, chrt, vals); err != nil {
		t.Fatalf("helm install: %v", err)
	}
	t.Logf("helm install: %v", time.Since(t0).Round(time.Millisecond))
}

// helmUpgrade runs helm upgrade of the release to chrt (nil: chartDir's) with vals over its
// values (as the CLI's --reuse-values), without waiting but for hooks.
func helmUpgrade(ctx context.Context, t testing.TB, c *clusterenv.Cluster, chrt chart.Charter, vals map[string]any) {
	t.Helper()
	chrt = loadChart(t, chrt)
	upgrade := action.NewUpgrade(helmConfig(t, c))
	upgrade.Namespace = installNamespace
	upgrade.ReuseValues = true
	upgrade.WaitStrategy = kube.HookOnlyStrategy
	if _, err := upgrade.RunWithContext(ctx, helmRelease, chrt, vals); err != nil {
		t.Fatalf("helm upgrade with %v: %v", vals, err)
	}
}

// TestE2EClusterHelm installs the control plane with the chart (helm install, the Go library)
// into a new single-node cluster, with the values that give the objects TestE2EClusterInstall
// applies (checked object by object before the install), everything else as installKEDA does;
// then real jobs run through it to their conclusion (installation.jobs), nothing is left
// running, and helm uninstall removes the release's objects and leaves the Secrets the
// operator made (deploy/README.md, "Helm").
func TestE2EClusterHelm(t *testing.T) {
	ctx, cancel := clusterTest(t, 15*time.Minute)
	defer cancel()
	in := installKEDAWith(ctx, t, installOptions{how: installHelm})
	in.runSteps(ctx, t, []step{
		{"Jobs", func(t *testing.T) { in.jobs(ctx, t) }},
		{"HelmTest", func(t *testing.T) { in.helmTest(ctx, t) }},
		{"NothingLeft", func(t *testing.T) { in.nothingLeft(ctx, t) }},
		{"Uninstall", func(t *testing.T) { in.helmUninstall(ctx, t) }},
	})
}

// helmTest runs helm test (the chart's `dispatch check` Pod) and reads its report, as `helm
// test --logs` does: the SPIRE Server reached (its SVID of the trust domain), every pool's
// registration accepted by Gitea, dispatch's NATS user and the
// assignments' stream found; the succeeded Pod is gone afterwards (its delete policy).
func (in *installation) helmTest(ctx context.Context, t *testing.T) {
	rt := action.NewReleaseTesting(helmConfig(t, in.c))
	rt.Namespace = installNamespace
	rt.Timeout = 3 * time.Minute
	reli, shutdown, err := rt.Run(helmRelease)
	var logs strings.Builder
	if rel, ok := reli.(*releasev1.Release); ok {
		if lerr := rt.GetPodLogs(&logs, rel); lerr != nil {
			t.Errorf("the check's logs: %v", lerr)
		}
	}
	if serr := shutdown(); serr != nil {
		t.Errorf("helm test's cleanup: %v", serr)
	}
	t.Logf("helm test --logs:\n%s", logs.String())
	if err != nil {
		t.Fatalf("helm test: %v", err)
	}
	for _, want := range []string{": pool linux: ok", ": user dispatch: ok", ": stream CI_RUNNER: ok", "/spire/server: ok"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the check's report lacks %q", want)
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		_, err := in.cs.CoreV1().Pods(installNamespace).Get(ctx, helmRelease+"-check", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the succeeded check Pod is still there: %v", err)
		}
	}
}

// helmUninstall runs helm uninstall and checks what is gone and what stays. The release is
// first upgraded to spire.podIdentity workload-api, the one mode whose release holds a
// cluster-scoped object (the ClusterRole gitea-dynamic-runner-nodes), so that its removal is
// checked on an object that was there: with the shipped mode there is none to remove.
func (in *installation) helmUninstall(ctx context.Context, t *testing.T) {
	if _, err := in.cs.AppsV1().Deployments(installNamespace).Get(ctx, "gateway", metav1.GetOptions{}); err != nil {
		t.Fatalf("before the uninstall: %v", err)
	}
	helmUpgrade(ctx, t, in.c, nil, map[string]any{"spire": map[string]any{"podIdentity": "workload-api"}})
	if _, err := in.cs.RbacV1().ClusterRoles().Get(ctx, "gitea-dynamic-runner-nodes", metav1.GetOptions{}); err != nil {
		t.Fatalf("no fault to check: the release with spire.podIdentity workload-api has no ClusterRole gitea-dynamic-runner-nodes: %v", err)
	}
	uninstall := action.NewUninstall(helmConfig(t, in.c))
	uninstall.WaitStrategy = kube.HookOnlyStrategy
	if _, err := uninstall.Run(helmRelease); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	gone := map[string]func() error{
		"Deployment gateway": func() error {
			_, err := in.cs.AppsV1().Deployments(installNamespace).Get(ctx, "gateway", metav1.GetOptions{})
			return err
		},
		"CronJob recover": func() error {
			_, err := in.cs.BatchV1().CronJobs(installNamespace).Get(ctx, "recover", metav1.GetOptions{})
			return err
		},
		"ConfigMap gdr-config": func() error {
			_, err := in.cs.CoreV1().ConfigMaps(installNamespace).Get(ctx, "gdr-config", metav1.GetOptions{})
			return err
		},
		"ClusterRole gitea-dynamic-runner-nodes": func() error {
			_, err := in.cs.RbacV1().ClusterRoles().Get(ctx, "gitea-dynamic-runner-nodes", metav1.GetOptions{})
			return err
		},
		"ClusterRoleBinding gitea-dynamic-runner-nodes": func() error {
			_, err := in.cs.RbacV1().ClusterRoleBindings().Get(ctx, "gitea-dynamic-runner-nodes", metav1.GetOptions{})
			return err
		},
	}
	for name, get := range gone {
		if err := get(); !apierrors.IsNotFound(err) {
			t.Errorf("%s after helm uninstall: %v, want not found", name, err)
		}
	}
	for _, s := range []string{"gdr-secrets", "gdr-runner-credentials"} {
		if _, err := in.cs.CoreV1().Secrets(installNamespace).Get(ctx, s, metav1.GetOptions{}); err != nil {
			t.Errorf("Secret %s (the operator's, not the release's) after helm uninstall: %v", s, err)
		}
	}
}

// TestE2EClusterHelmBuiltinIdentity installs a release with identity ca into a cluster that
// runs no SPIRE Server or agent, with no key made and no pool registered by hand
// (installKEDAWith's identity ca: Gitea's registration token, NATS's users and KEDA's Gitea
// token): `make release` makes it for the test's registry, `make push` pushes it there, and the
// chart installed is the one pulled from there, every function running the release's image by
// digest. The keys Job makes every key, the CA, its bundle and the gateway's certificate, and
// registers the pools; real jobs run to their conclusion, each executor with an SVID handle
// minted from that CA; the gateway refuses a forged and a re-targeted SVID; helm test passes; an
// upgrade to a second release (its images' indexes stamped anew, so every function is replaced)
// keeps every key and a job running across it succeeds; helm uninstall takes what the keys Job
// made.
func TestE2EClusterHelmBuiltinIdentity(t *testing.T) {
	ctx, cancel := clusterTest(t, 20*time.Minute)
	defer cancel()
	const first, second = "v0.0.0-e2e.1", "v0.0.0-e2e.2"
	in := installKEDAWith(ctx, t, installOptions{how: installHelm, identity: "ca", release: first})
	var made map[string]string
	in.runSteps(ctx, t, []step{
		{"Keys", func(t *testing.T) {
			in.waitJobComplete(ctx, t, "keys-1")
			made = in.builtinKeys(ctx, t)
		}},
		{"Release", func(t *testing.T) {
			n := in.runRelease(ctx, t, in.releases.manifest(t, first))
			t.Logf("%d containers run release %s's images", n, first)
		}},
		{"Jobs", func(t *testing.T) { in.jobs(ctx, t) }},
		{"HelmTest", func(t *testing.T) { in.helmBlock(ctx, t, "check", "") }},
		{"Upgrade", func(t *testing.T) { in.upgradeAcrossAJob(ctx, t, second, made) }},
		{"RotateCA", func(t *testing.T) { in.rotateCA(ctx, t) }},
		{"NothingLeft", func(t *testing.T) { in.nothingLeft(ctx, t) }},
		{"Uninstall", func(t *testing.T) {
			// What the operator (and this test, as one) made before the install stays.
			operators := map[string]bool{"gdr-registration-token": true, "gdr-gitea-read": true, registrySecret: true,
				"dispatch-webhook": true, "gateway-probe": true}
			for _, u := range natsUsers {
				operators["gdr-nats-"+strings.ReplaceAll(strings.ToLower(u), "_", "-")] = true
			}
			if left := in.leftAfterUninstall(ctx, t, operators); len(left) < 10 {
				t.Fatalf("no fault to check: before the uninstall only %v", left)
			}
			in.helmBlock(ctx, t, "uninstall", "")
			for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(2 * time.Second) {
				left := in.leftAfterUninstall(ctx, t, operators)
				if len(left) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after helm uninstall, objects of ours are still there: %v", left)
				}
			}
		}},
	})
}

// upgradeAcrossAJob starts a job that logs for about 90 s, probes the gateway with forged and
// re-targeted SVIDs while it runs (gatewayRefuses), publishes the release version and upgrades
// to its chart; the upgrade's keys Job keeps every key (made), the gateway's Pod is replaced by
// one running the new release's image while the job still runs, and the job then succeeds with
// every line it logged and none of the probes'.
func (in *installation) upgradeAcrossAJob(ctx context.Context, t *testing.T, version string, made map[string]string) {
	t.Helper()
	in.releases.publish(ctx, t, version)
	m := in.releases.manifest(t, version)
	repo := in.g.CreateRepo(t, "across-upgrade")
	in.g.PushWorkflow(t, repo, ".gitea/workflows/ci.yml", `on: push
jobs:
  across:
    runs-on: ubuntu-latest
    steps:
      - run: for i in $(seq 1 45); do echo "tick $i"; sleep 2; done
`)
	in.gatewayRefuses(ctx, t, repo)
	before := in.gatewayPods(ctx, t)
	in.helm.vars["NEW_VERSION"] = version
	in.helmBlock(ctx, t, "upgrade", "")
	in.waitJobComplete(ctx, t, "keys-2")
	in.waitJobComplete(ctx, t, "handle-setup-2")
	if after := in.builtinKeys(ctx, t); !maps.Equal(after, made) {
		t.Fatal("the upgrade's keys Job changed a key")
	}
	in.runRelease(ctx, t, m)
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		now := in.gatewayPods(ctx, t)
		replaced := false
		for name, image := range now {
			if _, old := before[name]; !old && image == m.Images["gateway"]+" ready" {
				replaced = true
			}
		}
		if replaced {
			t.Logf("gateway Pods before the upgrade %v, after %v", before, now)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no gateway Pod of release %s ready: before %v, now %v", version, before, now)
		}
	}
	for _, j := range in.g.Jobs(t, repo) {
		if j.Status == "completed" {
			t.Fatalf("the job ended (%s) before the upgrade was done: it no longer runs across it", j.Conclusion)
		}
	}
	job := in.waitCompleted(ctx, t, repo, "across", 5*time.Minute)
	logs := in.g.JobLogs(t, repo, job.ID)
	if job.Conclusion != "success" || !strings.Contains(logs, "tick 45") || strings.Contains(logs, "gdr-probe-") {
		t.Fatalf("the job across the upgrade: %s\n%s", job.Conclusion, logs)
	}
}

// gatewayPods maps each gateway Pod's name to its image, then " ready" when it is Ready.
func (in *installation) gatewayPods(ctx context.Context, t *testing.T) map[string]string {
	t.Helper()
	pods, err := in.cs.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gateway"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		state := ""
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
				state = " ready"
			}
		}
		out[p.Name] = p.Spec.Containers[0].Image + state
	}
	return out
}

// builtinKeys checks what the keys Job made with identity ca, owned by the release's gdr-config:
// the keys, the verification key, the CA (handle's), the bundle holding its root, and the
// gateway's certificate for its SPIFFE ID, verified by that bundle. It returns a digest of every
// key, for an upgrade to compare.
func (in *installation) builtinKeys(ctx context.Context, t *testing.T) map[string]string {
	t.Helper()
	cfg, err := in.cs.CoreV1().ConfigMaps(installNamespace).Get(ctx, "gdr-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	td, err := spiffeid.TrustDomainFromString(cfg.Data["GDR_TRUST_DOMAIN"])
	if err != nil {
		t.Fatal(err)
	}
	digest := map[string]string{}
	owned := func(name string, refs []metav1.OwnerReference) {
		if len(refs) != 1 || refs[0].UID != cfg.UID {
			t.Errorf("%s is not owned by gdr-config: %+v", name, refs)
		}
	}
	secret := func(name string) map[string][]byte {
		s, err := in.cs.CoreV1().Secrets(installNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Secret %s: %v", name, err)
		}
		owned("Secret "+name, s.OwnerReferences)
		for k, v := range s.Data {
			digest[name+"/"+k] = fmt.Sprintf("%x", sha256.Sum256(v))
		}
		return s.Data
	}
	runners, err := in.cs.CoreV1().Secrets(installNamespace).Get(ctx, "gdr-runner-credentials", metav1.GetOptions{})
	if err != nil || len(runners.Data) == 0 {
		t.Fatalf("the keys Job registered no pool: %v", err)
	}
	owned("Secret gdr-runner-credentials", runners.OwnerReferences)
	keys := secret("gdr-secrets")
	for _, k := range []string{"bootstrap-key", "payload-key", "webhook-secret", "tick-token", "assignment-signing-key"} {
		if len(keys[k]) == 0 {
			t.Errorf("gdr-secrets lacks %s", k)
		}
	}
	caData := secret("gdr-identity-ca")
	ca, err := svidca.Parse(caData["ca.pem"], caData["ca-key.pem"], td)
	if err != nil {
		t.Fatalf("gdr-identity-ca: %v", err)
	}
	bundleCM, err := in.cs.CoreV1().ConfigMaps(installNamespace).Get(ctx, "gdr-identity-bundle", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owned("ConfigMap gdr-identity-bundle", bundleCM.OwnerReferences)
	bundle, err := x509bundle.Parse(td, []byte(bundleCM.Data["bundle.pem"]))
	if err != nil || !bundle.HasX509Authority(ca.Certificate()) {
		t.Fatalf("gdr-identity-bundle: %v, holds the CA's root: %v", err, err == nil && bundle.HasX509Authority(ca.Certificate()))
	}
	gw := secret("gdr-gateway-svid")
	svid, err := x509svid.Parse(gw["tls.crt"], gw["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID.String() != cfg.Data["GDR_GATEWAY_SPIFFE_ID"] {
		t.Errorf("the gateway's certificate is %s, want %s", svid.ID, cfg.Data["GDR_GATEWAY_SPIFFE_ID"])
	}
	if _, _, err := x509svid.Verify(svid.Certificates, bundle); err != nil {
		t.Errorf("the bundle does not verify the gateway's certificate: %v", err)
	}
	return digest
}

// waitJobComplete waits until the Job name of installNamespace completed.
func (in *installation) waitJobComplete(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		j, err := in.cs.BatchV1().Jobs(installNamespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && j.Status.Succeeded > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Job %s not complete: %v %+v", name, err, j)
		}
	}
}
