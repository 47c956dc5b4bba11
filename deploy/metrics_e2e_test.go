//go:build e2e

package deploy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
)

// gatewayMetricsNodePort is where the test reaches the gateway's metrics
// listener (a NodePort, as it reaches dispatch serve's webhook).
const gatewayMetricsNodePort = 30090

// dashboardFed scrapes every long-lived function of the install as
// Prometheus would (dispatch serve's listener, the gateway's
// GDR_METRICS_ADDR; handle and recover are short-lived Jobs on the KEDA
// path, which no Prometheus scrapes), twice, 20 s apart, after the jobs ran,
// and evaluates every query of the shipped dashboard over what it read:
// none may be empty. The jobs' own metrics (by result, their run, their
// queue wait and push to running) must count the jobs Jobs ran to success.
func (in *installation) dashboardFed(ctx context.Context, t *testing.T) {
	if _, err := in.cs.CoreV1().Services(installNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "gateway-metrics-e2e"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app.kubernetes.io/name": "gateway"},
			Ports:    []corev1.ServicePort{{Name: "metrics", Port: 9090, TargetPort: intstr.FromString("metrics"), NodePort: gatewayMetricsNodePort}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	urls := map[string]string{
		"dispatch": fmt.Sprintf("http://%s/metrics", net.JoinHostPort(in.c.NodeIP(), fmt.Sprint(dispatchNodePort))),
		"gateway":  fmt.Sprintf("http://%s/metrics", net.JoinHostPort(in.c.NodeIP(), fmt.Sprint(gatewayMetricsNodePort))),
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	var scrapes []scraped
	last := map[string]metrics.Families{}
	for i := range 2 {
		if i > 0 {
			time.Sleep(20 * time.Second)
		}
		for name, url := range urls {
			var fams metrics.Families
			var err error
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
				if fams, err = metrics.Scrape(ctx, hc, url); err == nil || time.Now().After(deadline) {
					break
				}
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			t.Logf("scrape %d of %s: %d families", i+1, name, len(fams))
			scrapes = append(scrapes, scraped{at: time.Now(), fams: fams})
			last[name] = fams
		}
	}
	gw := last["gateway"]
	// Jobs ran the plain, container: and services: jobs to success.
	if v, ok := gw.Value("gdr_jobs_total", "pool", "linux", "result", "success"); !ok || v < 3 {
		t.Errorf("gdr_jobs_total{pool=linux,result=success} = %v (%v), want the 3 jobs of Jobs at least", v, ok)
	}
	if v, ok := gw.Value("gdr_job_duration_seconds", "pool", "linux", "result", "success"); !ok || v < 1 {
		t.Errorf("gdr_job_duration_seconds{pool=linux,result=success} count = %v (%v)", v, ok)
	}
	// dispatch timed the same jobs from Gitea's workflow_job webhook.
	for _, name := range []string{"gdr_job_queue_wait_seconds", "gdr_job_push_to_running_seconds"} {
		if v, ok := last["dispatch"].Value(name, "pool", "linux"); !ok || v < 3 {
			t.Errorf("%s{pool=linux} count = %v (%v), want the 3 jobs of Jobs at least", name, v, ok)
		}
	}
	assertDashboardFed(ctx, t, scrapes)
}

// recoverStatus runs deploy/keda/manual/recover-status.yaml as an operator
// would (kubectl create, then its log): the Job completes and its log is
// `recover status`'s report, a row for the pool.
func (in *installation) recoverStatus(ctx context.Context, t *testing.T) {
	name := in.runManualJob(ctx, t, "recover-status.yaml")
	out := in.jobLogs(ctx, t, name)
	t.Logf("recover status:\n%s", out)
	for _, want := range []string{"POOL", "IN FLIGHT", "linux"} {
		if !strings.Contains(out, want) {
			t.Errorf("recover-status Job's log lacks %q", want)
		}
	}
}

// manualJobPlaceholder is the image deploy/keda/manual's Jobs name, which
// deploy/REFERENCE.md's command replaces with the installed recover CronJob's.
const manualJobPlaceholder = "ghcr.io/example/gitea-dynamic-runner-recover:latest"

// runManualJob creates deploy/keda/manual/<file> as deploy/REFERENCE.md tells
// an operator to (its placeholder image replaced by the image of the
// installed recover CronJob, then kubectl create), with what this cluster
// needs besides (localize: no SPIFFE CSI driver, images loaded on the node),
// and waits for its Job to complete; it returns the Job's name.
func (in *installation) runManualJob(ctx context.Context, t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("keda", "manual", file))
	if err != nil {
		t.Fatal(err)
	}
	cron, err := in.cs.BatchV1().CronJobs(installNamespace).Get(ctx, "recover", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	image := cron.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Image
	if !strings.Contains(string(data), manualJobPlaceholder) {
		t.Fatalf("keda/manual/%s does not name %s, which deploy/REFERENCE.md's command replaces", file, manualJobPlaceholder)
	}
	data = []byte(strings.ReplaceAll(string(data), manualJobPlaceholder, image))
	var job batchv1.Job
	if err := yaml.UnmarshalStrict(data, &job); err != nil {
		t.Fatal(err)
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&job)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	in.localize(u)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &job); err != nil {
		t.Fatal(err)
	}
	if got := job.Spec.Template.Spec.Containers[0].Image; got != image {
		t.Fatalf("keda/manual/%s runs %s after localizing, want the CronJob's %s", file, got, image)
	}
	created, err := in.cs.BatchV1().Jobs(installNamespace).Create(ctx, &job, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		j, err := in.cs.BatchV1().Jobs(installNamespace).Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if j.Status.Succeeded > 0 {
			return j.Name
		}
		if j.Status.Failed > 0 || time.Now().After(deadline) {
			t.Fatalf("Job %s did not succeed (%+v):\n%s", j.Name, j.Status, in.jobLogs(ctx, t, j.Name))
		}
	}
}
