//go:build e2e

package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nats-io/nats.go"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// TestE2EClusterDayTwo runs docs/OPERATIONS.md's day-two blocks (marked ops-test) as written,
// with kubectl, on an installation of deploy/keda (installKEDA, dispatch and the gateway scaled
// from zero as shipped), with jobs running across them: Pause, then NATSLoss.
func TestE2EClusterDayTwo(t *testing.T) {
	ctx, cancel := clusterTest(t, 35*time.Minute)
	defer cancel()
	kubectl := testenv.RequirePeer(t, testenv.Peer{Name: "kubectl", Version: kubectlVersion, Executables: []string{"kubectl"}})
	in := installKEDA(ctx, t, 0)
	sh := &readmeShell{dir: t.TempDir(), env: []string{
		"PATH=" + kubectl + string(os.PathListSeparator) + os.Getenv("PATH"),
		"KUBECONFIG=" + in.c.AdminKubeconfig(),
		"HOME=" + os.Getenv("HOME"),
	}}
	// The rotations run in a checkout (they go run the project's commands), with Gitea's
	// address from this machine.
	rot := &readmeShell{dir: cloneCheckout(t), env: sh.env, vars: map[string]string{"GITEA": in.g.URL}}
	in.runSteps(ctx, t, []step{
		{"Pause", func(t *testing.T) { in.pauseResume(ctx, t, sh) }},
		{"NATSLoss", func(t *testing.T) { in.natsLoss(ctx, t, sh) }},
		{"RotateKeys", func(t *testing.T) { in.rotateKeys(ctx, t, rot) }},
		{"RotateRunners", func(t *testing.T) { in.rotateRunners(ctx, t, rot) }},
		{"RotateNATS", func(t *testing.T) { in.rotateNATS(ctx, t, rot) }},
	})
}

// opsBlock returns docs/OPERATIONS.md's block marked ops-test: phase name.
func opsBlock(t testing.TB, phase, name string) readmeBlock {
	t.Helper()
	for _, b := range docBlocks(t, operationsDoc, opsMarker) {
		if b.phase == phase && b.name == name {
			return b
		}
	}
	t.Fatalf("%s has no block marked ops-test: %s %s", operationsDoc, phase, name)
	return readmeBlock{}
}

// dispatchSelector selects dispatch serve's Pods.
const dispatchSelector = "app.kubernetes.io/name=dispatch,app.kubernetes.io/component=serve"

// pauseResume: a job runs; OPERATIONS' pause block lands while it does (asserted: every
// dispatch Pod from before it is gone, and the one KEDA starts for the next job logs the pool
// paused); a job pushed then stays queued in Gitea with no executor for 30 s while that
// dispatch runs; the running job ends success; the resume block lets dispatch claim and run the
// queued one.
func (in *installation) pauseResume(ctx context.Context, t *testing.T, sh *readmeShell) {
	running := in.pushJob(t, "paused-long", `sleep 40; echo "ran through the pause"`)
	in.waitStepRunning(ctx, t, running)

	pausedAt := time.Now().Add(-time.Second) // creation times are whole seconds
	sh.run(ctx, t, opsBlock(t, "pause", "all"), "")
	cm, err := in.cs.CoreV1().ConfigMaps(installNamespace).Get(ctx, "gdr-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cm.Data["GDR_PAUSED_POOLS"]; got != "*" {
		t.Fatalf("gdr-config GDR_PAUSED_POOLS %q after the pause block, want *", got)
	}
	// Nothing started before the pause may claim the next job.
	in.waitDispatchSince(ctx, t, pausedAt, false)

	queued := in.pushJob(t, "paused-later", `echo "claimed after the resume"`)
	pod := in.waitDispatchSince(ctx, t, pausedAt, true)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		if slices.ContainsFunc(strings.Split(in.podLog(ctx, t, installNamespace, pod), "\n"), func(l string) bool {
			return strings.Contains(l, `"msg":"pool paused: claiming nothing for it"`) && strings.Contains(l, `"pool":"linux"`)
		}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dispatch Pod %s does not log the pool linux paused:\n%s", pod, tail(in.podLog(ctx, t, installNamespace, pod), 3000))
		}
	}
	for until := time.Now().Add(30 * time.Second); time.Now().Before(until); time.Sleep(time.Second) {
		for _, j := range in.g.Jobs(t, queued) {
			if j.Status != "queued" {
				t.Fatalf("job %s %s while its pool is paused, want queued", j.Name, j.Status)
			}
		}
		if p := in.executorsOf(ctx, t, queued); len(p) != 0 {
			t.Fatalf("executor Pods %v for a job pushed while paused", p)
		}
	}

	j := in.waitCompleted(ctx, t, running, "paused-long", 3*time.Minute)
	if j.Conclusion != "success" {
		t.Fatalf("the job running across the pause: %s, want success; log:\n%s", j.Conclusion, in.g.JobLogs(t, running, j.ID))
	}
	if log := in.g.JobLogs(t, running, j.ID); !strings.Contains(log, "ran through the pause") {
		t.Fatalf("the long job's log lacks its step's output:\n%s", log)
	}

	sh.run(ctx, t, opsBlock(t, "resume", "all"), "")
	j = in.waitCompleted(ctx, t, queued, "paused-later", 4*time.Minute)
	if j.Conclusion != "success" {
		t.Fatalf("the job queued while paused: %s after the resume, want success; log:\n%s", j.Conclusion, in.g.JobLogs(t, queued, j.ID))
	}
}

// waitDispatchSince waits until every dispatch serve Pod was created at or after since (those
// from before are gone, terminating ones included) and, with ready, one of them is Ready; it
// returns that Pod's name ("" without ready).
func (in *installation) waitDispatchSince(ctx context.Context, t *testing.T, since time.Time, ready bool) string {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		pods, err := in.cs.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: dispatchSelector})
		if err != nil {
			t.Fatal(err)
		}
		old, readyPod := []string{}, ""
		for _, p := range pods.Items {
			if p.CreationTimestamp.Time.Before(since) {
				old = append(old, p.Name)
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					readyPod = p.Name
				}
			}
		}
		if len(old) == 0 && (!ready || readyPod != "") {
			return readyPod
		}
		if time.Now().After(deadline) {
			in.dump(ctx, t)
			t.Fatalf("dispatch Pods from before %v: %v; a Ready one since: %q (wanted: %v)", since, old, readyPod, ready)
		}
	}
}

// podLog returns the log of the Pod name's only container.
func (in *installation) podLog(ctx context.Context, t *testing.T, namespace, name string) string {
	t.Helper()
	out, err := in.cs.CoreV1().Pods(namespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of %s/%s: %v", namespace, name, err)
	}
	return string(out)
}

// executorsOf returns the names of the executor Pods of repo, in any phase.
func (in *installation) executorsOf(ctx context.Context, t *testing.T, repo string) []string {
	t.Helper()
	pods, err := in.cs.CoreV1().Pods(jobsNamespace).List(ctx, metav1.ListOptions{LabelSelector: executorSelector})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.Annotations[repositoryAnnotation] == repo {
			names = append(names, p.Name)
		}
	}
	return names
}

// natsLoss: a job runs; NATS loses its store (asserted: the server is back with no stream); a
// job pushed then waits; OPERATIONS' nats-lost blocks run as written with my-deploy (the
// installed objects, as the operator's overlay builds them). The running job, long enough to
// outlast the gateway's cooldown after the converge, ends success; the second is claimed and
// succeeds; a recover pass removes the first one's executor.
func (in *installation) natsLoss(ctx context.Context, t *testing.T, sh *readmeShell) {
	if len(in.objs) == 0 {
		t.Fatal("no objects to build my-deploy from: installed with Helm?")
	}
	overlay := filepath.Join(sh.dir, "my-deploy")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, obj := range in.objs {
		data, err := yaml.Marshal(obj.Object)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, string(data))
	}
	if err := errors.Join(os.WriteFile(filepath.Join(overlay, "installed.yaml"), []byte(strings.Join(all, "---\n")), 0o600),
		os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte("resources: [installed.yaml]\n"), 0o600)); err != nil {
		t.Fatal(err)
	}

	running := in.pushJob(t, "lost-long", `sleep 100; echo "outlived the store"`)
	in.waitStepRunning(ctx, t, running)
	executor := in.executorPod(ctx, t, running)

	in.nats.wipe(t)
	var jsz struct {
		Streams   int `json:"streams"`
		Consumers int `json:"consumers"`
	}
	resp, err := http.Get("http://" + in.monitor + "/jsz")
	if err == nil {
		err = json.NewDecoder(resp.Body).Decode(&jsz)
		resp.Body.Close()
	}
	if err != nil {
		t.Fatalf("nats-server's /jsz after the wipe: %v", err)
	}
	if jsz.Streams != 0 || jsz.Consumers != 0 {
		t.Fatalf("nats-server holds %d streams and %d consumers after its store was wiped, want none", jsz.Streams, jsz.Consumers)
	}
	queued := in.pushJob(t, "lost-after", `echo "claimed after the loss"`)

	sh.run(ctx, t, opsBlock(t, "nats-lost", "converge"), "")
	j := in.waitCompleted(ctx, t, queued, "lost-after", 4*time.Minute)
	if log := in.g.JobLogs(t, queued, j.ID); j.Conclusion != "success" || !strings.Contains(log, "claimed after the loss") {
		t.Fatalf("the job pushed after the loss: %s, want success with its step's output; log:\n%s", j.Conclusion, log)
	}
	j = in.waitCompleted(ctx, t, running, "lost-long", 4*time.Minute)
	if log := in.g.JobLogs(t, running, j.ID); j.Conclusion != "success" || !strings.Contains(log, "outlived the store") {
		t.Fatalf("the job running across the loss: %s, want success with its step's output; log:\n%s", j.Conclusion, log)
	}
	in.runManualRecover(ctx, t)
	in.waitPodGone(ctx, t, executor, 2*time.Minute)
	sh.run(ctx, t, opsBlock(t, "nats-lost", "release"), "")
}

// pushJob pushes a workflow of one job named name, whose step runs script, to a new repository
// of that name and returns the repository.
func (in *installation) pushJob(t *testing.T, name, script string) string {
	t.Helper()
	repo := in.g.CreateRepo(t, name)
	in.g.PushWorkflow(t, repo, ".gitea/workflows/ci.yml", "on: push\njobs:\n  "+name+":\n    runs-on: ubuntu-latest\n    steps:\n      - run: "+script+"\n")
	return repo
}

// waitStepRunning waits for the step of repo's job to start.
func (in *installation) waitStepRunning(ctx context.Context, t *testing.T, repo string) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		if slices.ContainsFunc(in.g.Jobs(t, repo), stepRunning) {
			return
		}
		if time.Now().After(deadline) {
			in.dump(ctx, t)
			t.Fatalf("the step of %s's job did not start within 3m", repo)
		}
	}
}

// succeeded waits for repo's job name to complete and fails t unless it succeeded with want in
// its log; it returns the job.
func (in *installation) succeeded(ctx context.Context, t *testing.T, repo, name, want string) giteaenv.Job {
	t.Helper()
	j := in.waitCompleted(ctx, t, repo, name, 5*time.Minute)
	if log := in.g.JobLogs(t, repo, j.ID); j.Conclusion != "success" || !strings.Contains(log, want) {
		in.dump(ctx, t)
		t.Fatalf("job %s of %s: %s, want success with %q in its log:\n%s", name, repo, j.Conclusion, want, log)
	}
	return j
}

// secretData returns the data of the Secret name of the control plane's namespace.
func (in *installation) secretData(ctx context.Context, t *testing.T, name string) map[string][]byte {
	t.Helper()
	s, err := in.cs.CoreV1().Secrets(installNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Data
}

// rotatedKeys are the secrets of gdr-secrets OPERATIONS rotates in three phases (add, swap,
// drop), each with the key of its list of old ones.
var rotatedKeys = []struct{ key, old string }{
	{"payload-key", "payload-old-keys"},
	{"bootstrap-key", "bootstrap-old-keys"},
	{"webhook-secret", "webhook-old-secrets"},
}

// rotateKeys rotates the payload key, the bootstrap key and the webhook secret together with
// OPERATIONS' blocks, a job running across: after the adds, Gitea's webhook gets the new secret
// (as OPERATIONS tells the administrator to); after the swaps gdr-secrets holds each new key
// (the one the add wrote) with the old one listed (asserted: the rotation happened), a job
// pushed then runs under the new keys while the first, sealed and signed under the old ones,
// ends success; after the drops no old key is listed, dispatch refuses a delivery signed with
// the old webhook secret (401) and takes one signed with the new, and a third job succeeds.
func (in *installation) rotateKeys(ctx context.Context, t *testing.T, sh *readmeShell) {
	before := in.secretData(ctx, t, "gdr-secrets")
	across := in.pushJob(t, "rotate-across", `sleep 90; echo "ran across the rotation"`)
	in.waitStepRunning(ctx, t, across)
	for _, k := range rotatedKeys {
		sh.run(ctx, t, opsBlock(t, "rotate", k.key+" add"), "")
	}
	newSecret, err := os.ReadFile(filepath.Join(sh.dir, "gdr-keys", "rotate", "webhook-secret.new"))
	if err != nil {
		t.Fatal(err)
	}
	in.g.SetSystemWebhookSecret(t, in.webhook, in.webhookURL(), string(newSecret))
	for _, k := range rotatedKeys {
		sh.run(ctx, t, opsBlock(t, "rotate", k.key+" swap"), "")
	}
	in.stillRunning(t, across, "the swaps")
	swapped := in.secretData(ctx, t, "gdr-secrets")
	for _, k := range rotatedKeys {
		made, err := os.ReadFile(filepath.Join(sh.dir, "gdr-keys", "rotate", k.key+".new"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(swapped[k.key], made) || bytes.Equal(swapped[k.key], before[k.key]) || !bytes.Equal(swapped[k.old], before[k.key]) {
			t.Fatalf("after the swap gdr-secrets' %s is the new key: %v, the old one listed in %s: %v", k.key,
				bytes.Equal(swapped[k.key], made) && !bytes.Equal(swapped[k.key], before[k.key]), k.old, bytes.Equal(swapped[k.old], before[k.key]))
		}
	}
	after := in.pushJob(t, "rotate-after", `echo "ran under the new keys"`)
	in.succeeded(ctx, t, after, "rotate-after", "ran under the new keys")
	in.succeeded(ctx, t, across, "rotate-across", "ran across the rotation")

	for _, k := range rotatedKeys {
		sh.run(ctx, t, opsBlock(t, "rotate", k.key+" drop"), "")
	}
	dropped := in.secretData(ctx, t, "gdr-secrets")
	for _, k := range rotatedKeys {
		if _, listed := dropped[k.old]; listed || !bytes.Equal(dropped[k.key], swapped[k.key]) {
			t.Fatalf("after the drop gdr-secrets lists %s (%v) or changed %s", k.old, listed, k.key)
		}
	}
	last := in.pushJob(t, "rotate-last", `echo "ran after the drop"`)
	in.succeeded(ctx, t, last, "rotate-last", "ran after the drop")
	// dispatch is up (KEDA's cooldown after the job): the old secret is refused now.
	for _, c := range []struct {
		secret []byte
		want   int
	}{{before["webhook-secret"], http.StatusUnauthorized}, {newSecret, http.StatusAccepted}} {
		body := []byte(`{}`)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, in.webhookURL(), bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(webhook.HeaderSignature, webhook.Sign(c.secret, body))
		req.Header.Set(webhook.HeaderEvent, "ping")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("a delivery to dispatch after the drop: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("a delivery signed with the %s secret: %d, want %d", map[bool]string{true: "old", false: "new"}[c.want == http.StatusUnauthorized], resp.StatusCode, c.want)
		}
	}
}

// webhookURL is where Gitea's system webhook delivers: dispatch's NodePort on the node.
func (in *installation) webhookURL() string {
	return fmt.Sprintf("http://%s/webhook", net.JoinHostPort(in.c.NodeIP(), fmt.Sprint(dispatchNodePort)))
}

// rotateRunners replaces the pools' runner registrations with OPERATIONS' blocks: new runners
// registered; the pause block lands while a job runs and returns once it is over (asserted
// completed success by then); a job pushed while paused waits; after the swap and resume
// gdr-runner-credentials holds another runner (asserted), which claims and runs the waiting job.
func (in *installation) rotateRunners(ctx context.Context, t *testing.T, sh *readmeShell) {
	before := in.secretData(ctx, t, "gdr-runner-credentials")
	if err := os.MkdirAll(filepath.Join(sh.dir, "gdr-keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sh.dir, "gdr-keys", "registration-token"), []byte(in.g.RegistrationToken(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	sh.run(ctx, t, opsBlock(t, "rotate", "runner-credentials register"), "")
	across := in.pushJob(t, "runners-across", `sleep 30; echo "ended under its runner"`)
	in.waitStepRunning(ctx, t, across)
	sh.run(ctx, t, opsBlock(t, "rotate", "runner-credentials pause"), "")
	var old giteaenv.Job
	for _, j := range in.g.Jobs(t, across) {
		old = j
	}
	if old.Status != "completed" || old.Conclusion != "success" {
		t.Fatalf("the job running at the pause: %s %s when the pause block returned, want completed success", old.Status, old.Conclusion)
	}
	waiting := in.pushJob(t, "runners-waiting", `echo "claimed by the new runner"`)
	sh.run(ctx, t, opsBlock(t, "rotate", "runner-credentials swap"), "")
	if after := in.secretData(ctx, t, "gdr-runner-credentials"); maps.EqualFunc(after, before, bytes.Equal) {
		t.Fatal("gdr-runner-credentials unchanged by the swap")
	}
	for _, j := range in.g.Jobs(t, waiting) {
		if j.Status != "queued" {
			t.Fatalf("job %s %s before the resume, want queued", j.Name, j.Status)
		}
	}
	sh.run(ctx, t, opsBlock(t, "rotate", "runner-credentials resume"), "")
	j := in.succeeded(ctx, t, waiting, "runners-waiting", "claimed by the new runner")
	if j.RunnerID == old.RunnerID || j.RunnerID == 0 {
		t.Fatalf("the job after the rotation ran on runner %d, the one before on %d: want a new runner", j.RunnerID, old.RunnerID)
	}
}

// rotateNATS replaces every function's nkey with OPERATIONS' blocks, the test's nats-server
// restarted with the files the add and the drop write (this machine's stand-in for the reload
// block, which restarts the NATS chart's StatefulSet): a job runs across the swap and succeeds,
// a job pushed after the drop succeeds, and the old dispatch seed is refused by then.
func (in *installation) rotateNATS(ctx context.Context, t *testing.T, sh *readmeShell) {
	keys := filepath.Join(sh.dir, "gdr-keys")
	reload := func() {
		env, err := os.ReadFile(filepath.Join(keys, "nats-users.env"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(env)), "\n") {
			k, v, ok := strings.Cut(line, "=")
			if !ok || !strings.HasPrefix(k, "NKEY_") {
				t.Fatalf("nats-users.env: line %q", line)
			}
			in.nats.keys[k] = v
		}
		conf, err := os.ReadFile(filepath.Join(keys, "nats-authorization.conf"))
		if err != nil {
			t.Fatal(err)
		}
		in.nats.restart(t, string(conf), false)
	}
	sh.run(ctx, t, opsBlock(t, "rotate", "nats-credentials add"), "")
	reload()
	across := in.pushJob(t, "nats-across", `sleep 60; echo "ran across the new keys"`)
	in.waitStepRunning(ctx, t, across)
	oldSeed := in.nats.seeds["DISPATCH"]
	sh.run(ctx, t, opsBlock(t, "rotate", "nats-credentials swap"), "")
	in.stillRunning(t, across, "the swap")
	in.succeeded(ctx, t, across, "nats-across", "ran across the new keys")
	sh.run(ctx, t, opsBlock(t, "rotate", "nats-credentials drop"), "")
	reload()
	for _, c := range []struct {
		seed string
		ok   bool
	}{{filepath.Join(keys, "nats-dispatch.nk"), true}, {oldSeed, false}} {
		nc, _, err := natsconn.Connect(ctx, natsconn.ConnSettings{URL: in.nats.url, NKey: c.seed}, "dispatch")
		if err == nil {
			nc.Close()
		}
		if c.ok && err != nil {
			t.Fatalf("dispatch's new key after the drop: %v", err)
		}
		if !c.ok && !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("dispatch's old key after the drop: %v, want an authorization violation", err)
		}
	}
	after := in.pushJob(t, "nats-after", `echo "ran on the new keys alone"`)
	in.succeeded(ctx, t, after, "nats-after", "ran on the new keys alone")
}

// stillRunning fails t unless repo's job is still in progress after what (the job must run
// across it to prove anything).
func (in *installation) stillRunning(t *testing.T, repo, what string) {
	t.Helper()
	for _, j := range in.g.Jobs(t, repo) {
		if j.Status != "in_progress" {
			t.Fatalf("job %s %s after %s, want still in progress (lengthen its step)", j.Name, j.Status, what)
		}
	}
}

// rotateCA rotates the built-in CA (the chart's identity ca) with OPERATIONS' two blocks in the
// Helm section's shell, a job running across: after the swap gdr-identity-ca holds another CA and
// the bundle both roots (asserted: the rotation happened) while the job still runs; a job pushed
// then (its SVID of the new CA) succeeds, and so does the first (its SVID of the old one); after
// the drop the bundle holds the new root alone, the gateway's certificate was renewed, and a
// third job succeeds.
func (in *installation) rotateCA(ctx context.Context, t *testing.T) {
	pems := func() (ca, bundle, gateway string) {
		s, err := in.cs.CoreV1().Secrets(installNamespace).Get(ctx, "gdr-identity-ca", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm, err := in.cs.CoreV1().ConfigMaps(installNamespace).Get(ctx, "gdr-identity-bundle", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		gw, err := in.cs.CoreV1().Secrets(installNamespace).Get(ctx, "gdr-gateway-svid", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(s.Data["ca.pem"]), cm.Data["bundle.pem"], string(gw.Data["tls.crt"]) + string(gw.Data["svid.pem"])
	}
	oldCA, _, oldGateway := pems()
	across := in.pushJob(t, "ca-across", `sleep 90; echo "ran across the CA rotation"`)
	in.waitStepRunning(ctx, t, across)
	in.helm.run(ctx, t, opsBlock(t, "rotate", "ca swap"), "")
	newCA, bundle, _ := pems()
	if newCA == oldCA || !strings.Contains(bundle, strings.TrimSpace(oldCA)) || !strings.Contains(bundle, strings.TrimSpace(newCA)) {
		t.Fatalf("after the swap: a new CA %v, the bundle holding the old root %v and the new %v", newCA != oldCA,
			strings.Contains(bundle, strings.TrimSpace(oldCA)), strings.Contains(bundle, strings.TrimSpace(newCA)))
	}
	in.stillRunning(t, across, "the CA swap")
	after := in.pushJob(t, "ca-after", `echo "ran on the new CA"`)
	in.succeeded(ctx, t, after, "ca-after", "ran on the new CA")
	in.succeeded(ctx, t, across, "ca-across", "ran across the CA rotation")
	in.helm.run(ctx, t, opsBlock(t, "rotate", "ca drop"), "")
	_, bundle, gateway := pems()
	if strings.Contains(bundle, strings.TrimSpace(oldCA)) || !strings.Contains(bundle, strings.TrimSpace(newCA)) || gateway == oldGateway {
		t.Fatalf("after the drop: the old root still trusted %v, the new one %v, the gateway's certificate renewed %v",
			strings.Contains(bundle, strings.TrimSpace(oldCA)), strings.Contains(bundle, strings.TrimSpace(newCA)), gateway != oldGateway)
	}
	last := in.pushJob(t, "ca-last", `echo "ran after the drop"`)
	in.succeeded(ctx, t, last, "ca-last", "ran after the drop")
}
