//go:build e2e

package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkE2EClusterIdleCost measures what the KEDA path costs while there is no work: deploy/keda
// installed as shipped (installKEDAWith, dispatch and the gateway from zero), one job run, then,
// once nothing of ours runs (waitZero), an idle window of GDR_BENCH_IDLE_WINDOW (default 10m) in
// which it counts
//
//	pods     Pods of ours started in the control plane's and the executors' namespace
//	cpu      the CPU time those Pods used (their pod cgroups' cpuacct.usage, read every 200 ms,
//	         the largest reading of each: a Pod's last 200 ms may be missed)
//	gitea    the HTTP requests Gitea answered (its router log), by path
//	nats     JetStream API requests (/jsz api.total) and client messages (/varz in_msgs), and the
//	         monitoring requests (/varz http_req_stats: KEDA's nats-jetstream triggers read /jsz)
//
// each scaled to an hour. Nothing else talks to Gitea or NATS meanwhile: the test's own pollers
// do not run in the window.
//
//	go test -tags e2e -run '^$' -bench E2EClusterIdleCost -benchtime 1x -timeout 60m ./deploy/
func BenchmarkE2EClusterIdleCost(b *testing.B) {
	window := 10 * time.Minute
	if v := os.Getenv("GDR_BENCH_IDLE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("GDR_BENCH_IDLE_WINDOW %q: want a positive duration", v)
		}
		window = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), window+30*time.Minute)
	defer cancel()
	in := installKEDAWith(ctx, b, installOptions{})
	repo := in.g.CreateRepo(b, "idle-cost")
	in.g.PushWorkflow(b, repo, ".gitea/workflows/ci.yml", idleWorkflow("warmup"))
	if job := in.waitCompleted(ctx, b, repo, "warmup", 5*time.Minute); job.Conclusion != "success" {
		b.Fatalf("job %+v, want success", job)
	}
	in.waitZero(ctx, b, 10*time.Minute)

	b.ResetTimer()
	t0 := time.Now()
	giteaFrom := fileSize(b, in.g.LogPath())
	natsFrom := in.natsCounters(ctx, b)
	known := map[string]bool{} // Pods of ours seen, by UID
	for _, uid := range in.ourPodUIDs(ctx, b) {
		known[uid] = true // running at the start (a recover pass): not counted
	}
	started := map[string]string{} // UID -> namespace/name of the Pods started in the window
	cpu := map[string]time.Duration{}
	for end := t0.Add(window); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		for uid, name := range in.ourPodsByUID(ctx, b) {
			if !known[uid] {
				known[uid] = true
				started[uid] = name
			}
		}
		readings, err := in.c.PodCPU()
		if err != nil {
			b.Fatal(err)
		}
		for uid, d := range readings {
			if _, ours := started[uid]; ours && d > cpu[uid] {
				cpu[uid] = d
			}
		}
	}
	elapsed := time.Since(t0)
	b.StopTimer()
	natsTo := in.natsCounters(ctx, b)
	calls := giteaCalls(b, in.g.LogPath(), giteaFrom)

	perHour := func(n float64) float64 { return n * float64(time.Hour) / float64(elapsed) }
	var total time.Duration
	var names []string
	for uid, name := range started {
		total += cpu[uid]
		names = append(names, fmt.Sprintf("%s %.2fs", name, cpu[uid].Seconds()))
	}
	sort.Strings(names)
	var giteaTotal int
	var paths []string
	for p, n := range calls {
		giteaTotal += n
		paths = append(paths, fmt.Sprintf("%s %d", p, n))
	}
	sort.Strings(paths)
	b.Logf("idle cost over %v: %d Pods of ours started (%.1f/h), their CPU %.2f s (%.1f s/h); Gitea %d requests (%.0f/h); NATS %d JetStream API requests (%.0f/h), %d client messages (%.0f/h), %d monitoring requests (%.0f/h)",
		elapsed.Round(time.Second), len(started), perHour(float64(len(started))), total.Seconds(), perHour(total.Seconds()),
		giteaTotal, perHour(float64(giteaTotal)), natsTo.api-natsFrom.api, perHour(float64(natsTo.api-natsFrom.api)),
		natsTo.inMsgs-natsFrom.inMsgs, perHour(float64(natsTo.inMsgs-natsFrom.inMsgs)),
		natsTo.monitor-natsFrom.monitor, perHour(float64(natsTo.monitor-natsFrom.monitor)))
	b.Logf("Pods started: %s", strings.Join(names, "; "))
	b.Logf("Gitea requests by path: %s", strings.Join(paths, "; "))
	b.ReportMetric(perHour(float64(len(started))), "pods/h")
	b.ReportMetric(perHour(total.Seconds()), "cpu-s/h")
	b.ReportMetric(perHour(float64(giteaTotal)), "gitea-calls/h")
	b.ReportMetric(perHour(float64(natsTo.api-natsFrom.api)), "nats-api/h")
	b.ReportMetric(perHour(float64(natsTo.monitor-natsFrom.monitor)), "nats-monitor/h")
}

// ourPodsByUID returns the Pods of the install and its executors that exist now, by UID, with
// their namespace/name.
func (in *installation) ourPodsByUID(ctx context.Context, tb testing.TB) map[string]string {
	tb.Helper()
	out := map[string]string{}
	for _, ns := range []string{installNamespace, jobsNamespace} {
		pods, err := in.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				out[string(p.UID)] = ns + "/" + p.Name
			}
		}
	}
	return out
}

func (in *installation) ourPodUIDs(ctx context.Context, tb testing.TB) []string {
	var uids []string
	for uid := range in.ourPodsByUID(ctx, tb) {
		uids = append(uids, uid)
	}
	return uids
}

// natsStats are nats-server's counters the idle cost reads.
type natsStats struct{ api, inMsgs, monitor uint64 }

// natsCounters reads them from the monitoring port; its own two requests count among the
// monitoring requests (two in thousands).
func (in *installation) natsCounters(ctx context.Context, tb testing.TB) natsStats {
	tb.Helper()
	get := func(path string, v any) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+in.monitor+path, nil)
		if err != nil {
			tb.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			tb.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			tb.Fatalf("%s: %v", path, err)
		}
	}
	var jsz struct {
		API struct {
			Total uint64 `json:"total"`
		} `json:"api"`
	}
	var varz struct {
		InMsgs  uint64            `json:"in_msgs"`
		HTTPReq map[string]uint64 `json:"http_req_stats"`
	}
	get("/jsz", &jsz)
	get("/varz", &varz)
	var monitor uint64
	for _, n := range varz.HTTPReq {
		monitor += n
	}
	return natsStats{api: jsz.API.Total, inMsgs: varz.InMsgs, monitor: monitor}
}

func fileSize(tb testing.TB, path string) int64 {
	tb.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		tb.Fatal(err)
	}
	return fi.Size()
}

// giteaRequest is the router's line for each request Gitea answered.
var giteaRequest = regexp.MustCompile(`router: completed (\S+) ([^?\s]+)\S* for `)

// giteaCalls counts the requests Gitea's log at path records after offset, by method and path.
func giteaCalls(tb testing.TB, path string, offset int64) map[string]int {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		tb.Fatal(err)
	}
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m := giteaRequest.FindStringSubmatch(sc.Text()); m != nil {
			out[m[1]+" "+m[2]]++
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}
