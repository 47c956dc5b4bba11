//go:build e2e

package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
)

// idleBound is how long after its push a job queued while everything is at zero may wait for
// its claim: KEDA's poll of Gitea's queue (pollingInterval 1 s), dispatch's Pod start and its
// first round, with room for a loaded machine. deploy/README.md and docs/OPERATIONS.md state it.
const idleBound = 30 * time.Second

// TestE2EClusterIdle installs the KEDA path as shipped (dispatch and the gateway start at zero
// replicas; KEDA starts them) and checks the promise of scale to zero:
//
//   - Job: a push runs its job to success (KEDA starts dispatch from Gitea's queue, the gateway
//     from the payload bucket's consumer); it saves an actions/cache entry.
//   - Zero: once the idle settings have passed (dispatch's and the gateway's cooldownPeriod,
//     handle's linger), no Pod of ours runs in the control plane's or the executors' namespace,
//     but for recover's scheduled pass, which must end; both Deployments are at zero replicas,
//     and stay so for 30 s.
//   - FromZero: a job queued in that state, whose webhook is dropped (Gitea's only webhook is
//     the test's, which answers 503 to every delivery: the fault is seen at the recorder), is
//     claimed within idleBound and runs to success, restoring the first job's cache entry: the
//     cache's volume outlived the gateway's replicas.
func TestE2EClusterIdle(t *testing.T) {
	ctx, cancel := clusterTest(t, 20*time.Minute)
	defer cancel()
	in := installKEDA(ctx, t, 0)
	// The one webhook: a recorder that drops every delivery. dispatch's is removed, so nothing
	// but KEDA's read of Gitea's queue can start dispatch.
	in.g.Do(t, http.MethodDelete, fmt.Sprintf("/admin/hooks/%d", in.webhook), nil, nil)
	rec := startDroppingWebhook(t)
	in.g.AddSystemWebhook(t, rec.url, "")
	in.g.HostAction(t, giteaenv.VendoredAction("cache-v4"), "actions", "cache", "v4")
	content := fmt.Sprintf("kept-%d", time.Now().UnixNano())
	repo := in.g.CreateRepo(t, "idle") // both jobs': the cache is kept per repository

	in.runSteps(ctx, t, []step{
		{"Job", func(t *testing.T) {
			in.g.PushWorkflow(t, repo, ".gitea/workflows/ci.yml", cacheWorkflow("first", content, false))
			if job := in.waitCompleted(ctx, t, repo, "first", 5*time.Minute); job.Conclusion != "success" {
				t.Fatalf("job %+v, want success; log:\n%s", job, in.g.JobLogs(t, repo, job.ID))
			}
		}},
		{"Zero", func(t *testing.T) {
			took := in.waitZero(ctx, t, 6*time.Minute)
			t.Logf("nothing of ours runs %v after the job ended", took.Round(time.Second))
			for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
				if left := in.ourPods(ctx, t); len(left) > 0 {
					t.Fatalf("at zero, then running again with no job: %v", left)
				}
			}
		}},
		{"FromZero", func(t *testing.T) {
			if left := in.ourPods(ctx, t); len(left) > 0 {
				t.Fatalf("not at zero before the push: %v", left)
			}
			pushed := time.Now()
			in.g.PushWorkflow(t, repo, ".gitea/workflows/ci.yml", cacheWorkflow("second", content, true))
			job := in.waitCompleted(ctx, t, repo, "second", 5*time.Minute)
			log := in.g.JobLogs(t, repo, job.ID)
			if job.Conclusion != "success" || !strings.Contains(log, "restored="+content) {
				t.Fatalf("job %+v, want success with the first job's cache entry restored; log:\n%s", job, log)
			}
			// The fault: Gitea delivered the job's queued event and it was dropped.
			queued, ok := rec.first("queued", job.ID)
			if !ok {
				t.Fatalf("no queued delivery of job %d reached the webhook (deliveries: %v)", job.ID, rec.all())
			}
			claimed, ok := rec.first("in_progress", job.ID)
			if !ok {
				t.Fatalf("no in_progress delivery of job %d (deliveries: %v)", job.ID, rec.all())
			}
			t.Logf("job %d: queued delivery %v after the push (dropped: 503), claimed %v after the push, success",
				job.ID, queued.Sub(pushed).Round(time.Millisecond), claimed.Sub(pushed).Round(time.Millisecond))
			if wait := claimed.Sub(pushed); wait > idleBound {
				t.Errorf("claimed %v after its push from zero, over the bound %v", wait, idleBound)
			}
		}},
	})
}

// cacheWorkflow is a one-job workflow for the pool linux, its job named name, which saves an
// actions/cache entry holding content (restore false) or restores it and prints it (restore
// true, failing on a miss).
func cacheWorkflow(name, content string, restore bool) string {
	if !restore {
		return `on: push
jobs:
  ` + name + `:
    runs-on: ubuntu-latest
    steps:
      - run: mkdir -p kept && echo ` + content + ` > kept/out.txt
      - uses: actions/cache@v4
        with:
          path: kept
          key: idle-v1
`
	}
	return `on: push
jobs:
  ` + name + `:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/cache@v4
        with:
          path: kept
          key: idle-v1
          fail-on-cache-miss: true
      - run: echo "restored=$(cat kept/out.txt)"
`
}

// idleWorkflow is a one-job workflow for the pool linux, its job named name.
func idleWorkflow(name string) string {
	return "on: push\njobs:\n  " + name + ":\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo idle\n"
}

// ourPods names the Pods of the install and its executors that run (not finished), but for a
// pass of the recover CronJob (a Job the CronJob owns), which the schedule allows.
func (in *installation) ourPods(ctx context.Context, tb testing.TB) []string {
	tb.Helper()
	var left []string
	for _, ns := range []string{installNamespace, jobsNamespace} {
		pods, err := in.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue // a finished Job's Pod, kept as history
			}
			if in.recoverPass(ctx, tb, &p) {
				continue
			}
			left = append(left, ns+"/"+p.Name+" ("+string(p.Status.Phase)+")")
		}
	}
	return left
}

// recoverPass reports whether p runs a Job of the CronJob recover.
func (in *installation) recoverPass(ctx context.Context, tb testing.TB, p *corev1.Pod) bool {
	job := p.Labels["batch.kubernetes.io/job-name"]
	if p.Namespace != installNamespace || job == "" {
		return false
	}
	j, err := in.cs.BatchV1().Jobs(installNamespace).Get(ctx, job, metav1.GetOptions{})
	if err != nil {
		return false // gone meanwhile: it ended
	}
	return ownedBy(j.OwnerReferences, "CronJob", "recover")
}

// waitZero waits, at most timeout, until nothing of ours runs (ourPods) and the Deployments
// dispatch and the gateway are scaled to zero, and returns how long that took.
func (in *installation) waitZero(ctx context.Context, tb testing.TB, timeout time.Duration) time.Duration {
	tb.Helper()
	t0 := time.Now()
	for deadline := t0.Add(timeout); ; time.Sleep(time.Second) {
		left := in.ourPods(ctx, tb)
		for _, name := range []string{"dispatch", "gateway"} {
			d, err := in.cs.AppsV1().Deployments(installNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				tb.Fatal(err)
			}
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 0 {
				left = append(left, fmt.Sprintf("Deployment %s at %v replicas", name, d.Spec.Replicas))
			}
		}
		if len(left) == 0 {
			return time.Since(t0)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			dumpPods(ctx, tb, in.cs)
			tb.Fatalf("still running %v after the last job: %v", timeout, left)
		}
	}
}

// droppingWebhook records Gitea's workflow_job deliveries (their action, job ID and arrival)
// and answers each 503: a webhook that loses every event.
type droppingWebhook struct {
	url string
	mu  sync.Mutex
	got []delivery
}

type delivery struct {
	action string
	job    int64
	at     time.Time
}

func (d delivery) String() string { return fmt.Sprintf("%s %d", d.action, d.job) }

func startDroppingWebhook(tb testing.TB) *droppingWebhook {
	tb.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(tb)))
	if err != nil {
		tb.Fatal(err)
	}
	w := &droppingWebhook{url: "http://" + ln.Addr().String() + "/"}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var body struct {
			Action string `json:"action"`
			Job    struct {
				ID int64 `json:"id"`
			} `json:"workflow_job"`
		}
		err := json.NewDecoder(http.MaxBytesReader(rw, r.Body, 1<<20)).Decode(&body)
		if err == nil && r.Header.Get("X-Gitea-Event") == "workflow_job" {
			w.mu.Lock()
			w.got = append(w.got, delivery{action: body.Action, job: body.Job.ID, at: time.Now()})
			w.mu.Unlock()
		}
		http.Error(rw, "dropped", http.StatusServiceUnavailable)
	})}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return w
}

// first returns when the first delivery of action for job arrived.
func (w *droppingWebhook) first(action string, job int64) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := slices.IndexFunc(w.got, func(d delivery) bool { return d.action == action && d.job == job })
	if i < 0 {
		return time.Time{}, false
	}
	return w.got[i].at, true
}

func (w *droppingWebhook) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var s []string
	for _, d := range w.got {
		s = append(s, d.String())
	}
	return strings.Join(s, ", ")
}
