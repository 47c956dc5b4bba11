//go:build e2e

package deploy

import (
	"context"
	"encoding/json"
	"errors"
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

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// TestE2EClusterDayTwo runs docs/OPERATIONS.md's day-two blocks (marked ops-test) as written,
// with kubectl, on an installation of deploy/keda (installKEDA, dispatch and the gateway scaled
// from zero as shipped), with jobs running across them: Pause, then NATSLoss.
func TestE2EClusterDayTwo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	kubectl := testenv.RequirePeer(t, testenv.Peer{Name: "kubectl", Version: kubectlVersion, Executables: []string{"kubectl"}})
	in := installKEDA(ctx, t, 0)
	sh := &readmeShell{dir: t.TempDir(), env: []string{
		"PATH=" + kubectl + string(os.PathListSeparator) + os.Getenv("PATH"),
		"KUBECONFIG=" + in.c.AdminKubeconfig(),
		"HOME=" + os.Getenv("HOME"),
	}}
	in.runSteps(ctx, t, []step{
		{"Pause", func(t *testing.T) { in.pauseResume(ctx, t, sh) }},
		{"NATSLoss", func(t *testing.T) { in.natsLoss(ctx, t, sh) }},
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
	running := in.g.CreateRepo(t, "paused-running")
	in.g.PushWorkflow(t, running, ".gitea/workflows/ci.yml", `on: push
jobs:
  long:
    runs-on: ubuntu-latest
    steps:
      - run: sleep 40; echo "ran through the pause"
`)
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		if slices.ContainsFunc(in.g.Jobs(t, running), stepRunning) {
			break
		}
		if time.Now().After(deadline) {
			in.dump(ctx, t)
			t.Fatal("the long job's step did not start within 3m")
		}
	}

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

	queued := in.g.CreateRepo(t, "paused-queued")
	in.g.PushWorkflow(t, queued, ".gitea/workflows/ci.yml", `on: push
jobs:
  later:
    runs-on: ubuntu-latest
    steps:
      - run: echo "claimed after the resume"
`)
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

	j := in.waitCompleted(ctx, t, running, "long", 3*time.Minute)
	if j.Conclusion != "success" {
		t.Fatalf("the job running across the pause: %s, want success; log:\n%s", j.Conclusion, in.g.JobLogs(t, running, j.ID))
	}
	if log := in.g.JobLogs(t, running, j.ID); !strings.Contains(log, "ran through the pause") {
		t.Fatalf("the long job's log lacks its step's output:\n%s", log)
	}

	sh.run(ctx, t, opsBlock(t, "resume", "all"), "")
	j = in.waitCompleted(ctx, t, queued, "later", 4*time.Minute)
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

	running := in.g.CreateRepo(t, "lost-running")
	in.g.PushWorkflow(t, running, ".gitea/workflows/ci.yml", `on: push
jobs:
  long:
    runs-on: ubuntu-latest
    steps:
      - run: sleep 100; echo "outlived the store"
`)
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		if slices.ContainsFunc(in.g.Jobs(t, running), stepRunning) {
			break
		}
		if time.Now().After(deadline) {
			in.dump(ctx, t)
			t.Fatal("the long job's step did not start within 3m")
		}
	}
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
	queued := in.g.CreateRepo(t, "lost-queued")
	in.g.PushWorkflow(t, queued, ".gitea/workflows/ci.yml", `on: push
jobs:
  after:
    runs-on: ubuntu-latest
    steps:
      - run: echo "claimed after the loss"
`)

	sh.run(ctx, t, opsBlock(t, "nats-lost", "converge"), "")
	j := in.waitCompleted(ctx, t, queued, "after", 4*time.Minute)
	if log := in.g.JobLogs(t, queued, j.ID); j.Conclusion != "success" || !strings.Contains(log, "claimed after the loss") {
		t.Fatalf("the job pushed after the loss: %s, want success with its step's output; log:\n%s", j.Conclusion, log)
	}
	j = in.waitCompleted(ctx, t, running, "long", 4*time.Minute)
	if log := in.g.JobLogs(t, running, j.ID); j.Conclusion != "success" || !strings.Contains(log, "outlived the store") {
		t.Fatalf("the job running across the loss: %s, want success with its step's output; log:\n%s", j.Conclusion, log)
	}
	in.runManualRecover(ctx, t)
	in.waitPodGone(ctx, t, executor, 2*time.Minute)
	sh.run(ctx, t, opsBlock(t, "nats-lost", "release"), "")
}
