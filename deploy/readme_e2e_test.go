//go:build e2e

package deploy

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kedaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/registryenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
)

// kubectlVersion is the kubectl scripts/peers/kubectl.sh builds, the test cluster's version.
const kubectlVersion = "v1.37.2"

// readmeHook is what TestE2EClusterReadme adds after the install block of that name, because
// the test cluster has no DNS and no SPIFFE CSI driver (docs/CLUSTER.md, "The README's
// install", shows it): the component deploy/testdata/readme-e2e and the pools' Workload API
// by hostPath (unused by executors with the default minted identity). The executors'
// namespace keeps the README's own label (Pod Security restricted): an executor the install
// makes must pass it.
const readmeHook = `echo 'components: [../deploy/testdata/readme-e2e]' >> my-deploy/kustomization.yaml
sed -i 's|^\( *\)#   \(workloadAPI: {hostPath: /run/spire/agent-sockets, socket: spire-agent.sock}\)$|\1\2|' my-deploy/pools.yaml
grep -q '^      workloadAPI: {hostPath: /run/spire/agent-sockets' my-deploy/pools.yaml
`

// TestE2EClusterReadme runs deploy/README.md's install, upgrade and uninstall as written: every
// block marked readme-test install, upgrade or uninstall, in order, each with bash, in a clean
// clone of this checkout, with only the documented variables set (to this cluster's values)
// and the tokens the install asks to paste on its standard input. The prerequisites the README
// installs with upstream's charts are the test's own: a real single-node cluster
// (clusterenv), KEDA's operator, spire-server with the shipped policy and an agent on the
// node, nats-server with the users the install made, Gitea, and a registry the node pulls
// from; kubectl is the cluster's version. After the install a job runs green in an executor in
// the executors' namespace; after the upgrade (new images, the signing key rotated) the
// control plane runs the new images, handle trusts the new key alone and a job runs green;
// after the uninstall no object of the install is left in any kind, and no SPIRE entry.
func TestE2EClusterReadme(t *testing.T) {
	ctx, cancel := clusterTest(t, 25*time.Minute)
	defer cancel()
	kubectl := testenv.RequirePeer(t, testenv.Peer{Name: "kubectl", Version: kubectlVersion, Executables: []string{"kubectl"}})
	work := cloneCheckout(t)

	c := clusterenv.Start(ctx, t)
	cs := c.Client(t)
	td := spiffeid.RequireTrustDomainFromString(spireenv.TrustDomain)
	spire := spireenv.Start(t, spireenv.WithK8sPSAT(clusterenv.SPIRECluster, c.AdminKubeconfig()),
		spireenv.WithShippedPolicy(t, "spire", map[string]any{"registrars": []string{
			spiffeid.RequireFromPath(td, "/gitea-dynamic-runner/handle-pod").String(),
			spiffeid.RequireFromPath(td, "/gitea-dynamic-runner/recover").String(),
		}, "minters": []string{spiffeid.RequireFromPath(td, "/gitea-dynamic-runner/handle-pod").String()}}))
	c.StartSPIREAgent(ctx, t, spire, 0)
	_, spirePort, err := net.SplitHostPort(spire.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// The README's $SPIRE_SERVER: the server's CLI on its admin socket.
	spireCLI := filepath.Join(t.TempDir(), "spire-server")
	if err := os.WriteFile(spireCLI, []byte(fmt.Sprintf("#!/bin/bash\nexec %q \"$1\" \"$2\" -socketPath %q \"${@:3}\"\n",
		spireenv.Binary(t), spire.Socket)), 0o755); err != nil {
		t.Fatal(err)
	}
	giteaPort := testenv.FreePort(t)
	giteaAddr, err := c.Forward(fmt.Sprintf("127.0.0.1:%d", giteaPort))
	if err != nil {
		t.Fatal(err)
	}
	g := giteaenv.Start(t, giteaenv.Options{Port: giteaPort, RootHost: c.NodeIP(),
		ExtraINI: "[webhook]\nALLOWED_HOST_LIST = loopback,private\n"})
	registry := registryenv.StartAnonymous(t)
	registryHost, err := c.Forward(registry.Addr)
	if err == nil {
		err = c.TrustPlainHTTPRegistry(registryHost)
	}
	if err != nil {
		t.Fatal(err)
	}
	kedaenv.Start(ctx, t, c.Plane.RESTConfig(), kedaenv.Options{WatchNamespace: installNamespace})
	monitor := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) // KEDA runs on the machine

	vars := map[string]string{
		"REG": registryHost + "/gdr", "TAG": "e2e-1", "NEW_TAG": "e2e-2",
		"VERSION": "v0.0.0-unused.1", "NEW_VERSION": "v0.0.0-unused.2", // the Helm section's (TestE2EClusterHelmBuiltinIdentity)
		"TD": td.Name(), "CLUSTER": clusterenv.SPIRECluster,
		"SPIRE": net.JoinHostPort(c.NodeIP(), spirePort), "SPIRE_SERVER": spireCLI,
		"GITEA": "http://" + giteaAddr + "/", "NATS_MONITOR": monitor, "NATS_REPLICAS": "1",
		"WEBHOOK": fmt.Sprintf("http://%s/webhook", net.JoinHostPort(c.NodeIP(), fmt.Sprint(dispatchNodePort))),
		// NATS: once nats-server runs with the users the install made (after nats-users).
	}
	documented := readmeVariables(t)
	for _, name := range documented {
		if _, ok := vars[name]; !ok && name != "NATS" {
			t.Fatalf("README.md documents $%s, which this test does not set", name)
		}
	}
	sh := &readmeShell{dir: work, vars: vars, env: []string{
		"PATH=" + kubectl + string(os.PathListSeparator) + os.Getenv("PATH"),
		"KUBECONFIG=" + c.AdminKubeconfig(),
		"HOME=" + os.Getenv("HOME"), // Go's caches
	}}
	stdin := map[string]string{"registration-token": g.RegistrationToken(t), "gitea-token": g.AdminToken,
		"gitea-read-token": g.CreateToken(t, "gdr-dispatch-wake", "read:admin")}
	in := &installation{c: c, cs: cs, g: g}
	top := t

	ok := t.Run("Install", func(t *testing.T) {
		for _, b := range readmePhase(t, "install") {
			sh.run(ctx, t, b, stdin[b.name])
			switch b.name {
			case "nats-users":
				// The prerequisite: nats-server with these users, as the skipped chart block runs
				// it, for the whole test (top: not stopped when Install ends).
				conf, err := os.ReadFile(authorizationFile)
				if err != nil {
					t.Fatal(err)
				}
				nats := startNATSWithUsers(top, string(conf), "http: "+monitor, filepath.Join(work, "gdr-keys", "nats-users.env"))
				u, err := url.Parse(nats)
				if err != nil {
					t.Fatal(err)
				}
				addr, err := c.Forward(u.Host)
				if err != nil {
					t.Fatal(err)
				}
				sh.vars["NATS"] = "nats://" + addr
			case "overlay":
				sh.run(ctx, t, readmeBlock{name: "the test's additions", text: readmeHook}, "")
				built := sh.output(ctx, t, "kubectl", "kustomize", "my-deploy")
				if strings.Contains(built, "driver: csi.spiffe.io") {
					t.Fatal("the overlay still mounts the SPIFFE CSI driver: deploy/testdata/readme-e2e's volume indexes are stale")
				}
			}
		}
		in.readmeJob(ctx, t, "installed", "e2e-1")
	})
	if ok {
		ok = t.Run("Upgrade", func(t *testing.T) {
			before, err := cs.CoreV1().ConfigMaps(installNamespace).Get(ctx, "gdr-assignment-verify-keys", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range readmePhase(t, "upgrade") {
				sh.run(ctx, t, b, "")
			}
			for _, name := range []string{"dispatch", "gateway"} {
				d, err := cs.AppsV1().Deployments(installNamespace).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if img := d.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(img, ":e2e-2") {
					t.Errorf("%s runs %s after the upgrade, want the tag e2e-2", name, img)
				}
			}
			after, err := cs.CoreV1().ConfigMaps(installNamespace).Get(ctx, "gdr-assignment-verify-keys", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			newKey, err := os.ReadFile(filepath.Join(work, "gdr-keys", "verify-keys"))
			if err != nil {
				t.Fatal(err)
			}
			if after.Data["verify-keys"] != string(newKey) || after.Data["verify-keys"] == before.Data["verify-keys"] {
				t.Fatalf("verify-keys after the rotation %q, want the new key alone %q (before: %q)", after.Data["verify-keys"], newKey, before.Data["verify-keys"])
			}
			secret, err := cs.CoreV1().Secrets(installNamespace).Get(ctx, "gdr-secrets", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			seed, err := os.ReadFile(filepath.Join(work, "gdr-keys", "assignment-signing-key"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(secret.Data["assignment-signing-key"], seed) {
				t.Fatal("gdr-secrets does not hold the new signing key")
			}
			if _, err := base64.StdEncoding.DecodeString(string(seed)); err != nil {
				t.Fatalf("the new signing key is not base64: %v", err)
			}
			// handle trusts only the new key now: a green job proves dispatch signs with it.
			in.readmeJob(ctx, t, "upgraded", "e2e-2")
		})
	}
	if ok {
		t.Run("Uninstall", func(t *testing.T) {
			// "Let the running jobs end first": until their executors are gone.
			in.waitNoExecutors(ctx, t)
			for _, b := range readmePhase(t, "uninstall") {
				sh.run(ctx, t, b, "")
			}
			nothingOfTheInstall(ctx, t, c)
			if entries := spire.AllEntries(t); len(entries) != 0 {
				var ids []string
				for _, e := range entries {
					ids = append(ids, e.GetId()+" "+e.GetSpiffeId().GetPath())
				}
				t.Errorf("SPIRE entries left after the uninstall: %q", ids)
			}
		})
	}
}

// readmeShell runs README blocks with bash in dir, with the documented variables and env.
type readmeShell struct {
	dir  string
	vars map[string]string
	env  []string
}

func (s *readmeShell) environ() []string {
	env := slices.Clone(s.env)
	for k, v := range s.vars {
		env = append(env, k+"="+v)
	}
	return env
}

// run runs block b (bash -euo pipefail) with stdin; it fails the test with its output when b
// fails.
func (s *readmeShell) run(ctx context.Context, t testing.TB, b readmeBlock, stdin string) {
	t.Helper()
	t0 := time.Now()
	c := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.text)
	c.Dir, c.Env, c.Stdin = s.dir, s.environ(), strings.NewReader(stdin)
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("block %q (%s:%d) failed: %v\n%s", b.name, b.file, b.line, err, out)
	}
	t.Logf("block %q (%s): %v", b.name, b.file, time.Since(t0).Round(100*time.Millisecond))
}

// output runs one command in the README's environment and returns its standard output.
func (s *readmeShell) output(ctx context.Context, t *testing.T, name string, args ...string) string {
	t.Helper()
	c := exec.CommandContext(ctx, name, args...)
	c.Dir, c.Env = s.dir, s.environ()
	out, err := c.Output()
	if err != nil {
		t.Fatalf("%s %q: %v", name, args, err)
	}
	return string(out)
}

// cloneCheckout clones this checkout (its HEAD) into a new folder: the README's commands run
// from a checkout's root and write my-deploy, gdr-keys and bin/images there.
func cloneCheckout(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "checkout")
	if out, err := exec.Command("git", "clone", "--quiet", "--shared", root, dir).CombinedOutput(); err != nil {
		testenv.Unavailable(t, fmt.Sprintf("the README's commands need a git clone of this checkout: %v\n%s", err, out))
	}
	return dir
}

// startNATSWithUsers runs nats-server (embedded, 127.0.0.1) with the authorization conf and
// the users' public keys of envFile (NKEY_<USER>=<public key> lines, what the install's
// nats-users block writes), and returns its client URL.
func startNATSWithUsers(t testing.TB, conf, extra, envFile string) string {
	t.Helper()
	data, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "NKEY_") || !strings.HasPrefix(v, "U") {
			t.Fatalf("%s: line %q is not NKEY_<USER>=<user public key>", envFile, line)
		}
		keys[k] = v
	}
	if len(keys) != len(natsUsers) {
		t.Fatalf("%s holds %d users, want %d (%v)", envFile, len(keys), len(natsUsers), natsUsers)
	}
	return runAuthorizedNATS(t, t.TempDir(), conf, extra, keys)
}

// readmeJob pushes a workflow to a new repository and waits for its job to succeed in an
// executor Pod of the executors' namespace that runs the runner-host image of tag.
func (in *installation) readmeJob(ctx context.Context, t *testing.T, name, tag string) {
	t.Helper()
	repo := in.g.CreateRepo(t, name)
	in.g.PushWorkflow(t, repo, ".gitea/workflows/ci.yml", `on: push
jobs:
  `+name+`:
    runs-on: ubuntu-latest
    steps:
      - run: echo "`+name+` in $(cat /etc/hostname)"
`)
	seen := ""
	for deadline := time.Now().Add(3 * time.Minute); seen == "" && time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		pods, err := in.cs.CoreV1().Pods(jobsNamespace).List(ctx, metav1.ListOptions{LabelSelector: executorSelector})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			for _, ctr := range p.Spec.Containers {
				if ctr.Name == "runner" {
					seen = p.Name + " " + ctr.Image
				}
			}
		}
		if seen == "" && slices.ContainsFunc(in.g.Jobs(t, repo), func(j giteaenv.Job) bool { return j.Status == "completed" }) {
			break
		}
	}
	j := in.waitCompleted(ctx, t, repo, name, 3*time.Minute)
	if j.Conclusion != "success" {
		in.dump(ctx, t)
		t.Fatalf("job %s: %s, want success; log:\n%s", name, j.Conclusion, in.g.JobLogs(t, repo, j.ID))
	}
	if log := in.g.JobLogs(t, repo, j.ID); !strings.Contains(log, name+" in gdr-linux-") {
		t.Errorf("job %s's log does not show it ran in an executor Pod:\n%s", name, log)
	}
	if !strings.HasSuffix(seen, "gitea-dynamic-runner-runner-host:"+tag) {
		t.Errorf("the executor seen in %s: %q, want one running runner-host:%s", jobsNamespace, seen, tag)
	}
}

// nothingOfTheInstall fails t when any object of the install is left: in every kind the API
// server serves that can be listed, no object in the install's namespaces (which must be gone)
// and none labelled part of gitea-dynamic-runner or named for it, anywhere.
func nothingOfTheInstall(ctx context.Context, t *testing.T, c *clusterenv.Cluster) {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(c.Plane.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.Plane.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	lists, err := dc.ServerPreferredResources()
	if err != nil && len(lists) == 0 {
		t.Fatal(err)
	}
	var left []string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(2 * time.Second) {
		left = nil
		kinds := 0
		for _, l := range lists {
			gv, err := schema.ParseGroupVersion(l.GroupVersion)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range l.APIResources {
				if !slices.Contains(r.Verbs, "list") || strings.Contains(r.Name, "/") {
					continue
				}
				kinds++
				objs, err := dyn.Resource(gv.WithResource(r.Name)).List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatalf("list %s: %v", r.Name, err)
				}
				for _, o := range objs.Items {
					if ours(o) {
						left = append(left, fmt.Sprintf("%s %s/%s", r.Kind, o.GetNamespace(), o.GetName()))
					}
				}
			}
		}
		if len(left) == 0 {
			t.Logf("nothing of the install left in %d kinds", kinds)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left after the uninstall: %q", left)
		}
	}
}

// ours reports whether o belongs to the install: in its namespaces, labelled part of it, or
// named for it (the namespaces, the cluster-scoped RBAC objects).
func ours(o unstructured.Unstructured) bool {
	ns := o.GetNamespace()
	if ns == installNamespace || ns == jobsNamespace {
		return true
	}
	if o.GetLabels()["app.kubernetes.io/part-of"] == "gitea-dynamic-runner" {
		return true
	}
	return strings.HasPrefix(o.GetName(), "gitea-dynamic-runner") && o.GetKind() != "Event"
}

// waitNoExecutors waits until the executors' namespace holds no executor Pod (recover has finished
// every job's executor, its SPIRE entry with it).
func (in *installation) waitNoExecutors(ctx context.Context, t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		pods, err := in.cs.CoreV1().Pods(jobsNamespace).List(ctx, metav1.ListOptions{LabelSelector: executorSelector})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			in.dump(ctx, t)
			t.Fatalf("%d executor Pods left 3 minutes after the last job", len(pods.Items))
		}
	}
}
