//go:build e2e

package deploy

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkE2EClusterBurst measures the burst table users compare CI
// services by: GDR_BENCH_BURSTS jobs (default "20,128") queued at once, one
// push each, on deploy/keda installed into the test cluster (installKEDAWith,
// SPIRE as shipped), from the push (the contents API call returning: Gitea
// has created every job) to each job's first step running in Gitea, p50, p95
// and max. Every burst starts from idle, as the product is most of the time:
// dispatch and the gateway at zero, no handle (waitZero), so KEDA's wake-up is
// on its path.
//
// Side by side in the same push, Gitea's floor: each job has a twin on a
// label no pool serves, claimed by a bare FetchTask loop (startFloor); the
// floor column is when the twins were claimed, which is as soon as Gitea
// hands out a burst's tasks.
//
// The pool's Pod template asks for burstRequests instead of the shipped
// 500m CPU and 1 GiB: the test node reports the machine's two cores, so the
// shipped requests would admit three executors at a time and the table would
// measure the scheduler's queue. With small requests every executor is
// admitted at once up to the kubelet's maxPods (110 per node, the
// Kubernetes default), and the machine's two cores are what limit: the
// figures are this machine's, not a fleet's. Also printed per burst: the
// most executor Pods that existed at once, how many were Pending at the
// peak (unschedulable: maxPods), the handle Jobs KEDA started, and the
// executors per node. GDR_BENCH_NODES (default 1) is the test cluster's node
// count (clusterenv.Options.Nodes; the nodes share the machine's cores);
// GDR_BENCH_CAPACITY (default: the shipped pools file's, 10) the pool's
// capacity, the most of its jobs claimed and not finished at once.
//
//	go test -tags e2e -run '^$' -bench E2EClusterBurst -benchtime 1x -timeout 60m ./deploy/
//	GDR_BENCH_NODES=2 GDR_BENCH_CAPACITY=200 go test -tags e2e -run '^$' -bench E2EClusterBurst -benchtime 1x -timeout 60m ./deploy/
func BenchmarkE2EClusterBurst(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	sizes := []int{20, 128}
	if v := os.Getenv("GDR_BENCH_BURSTS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				b.Fatalf("GDR_BENCH_BURSTS %q: want positive counts, comma-separated", v)
			}
			sizes = append(sizes, n)
		}
	}
	nodes := benchCount(b, "GDR_BENCH_NODES", 1, 1)
	capacity := benchCount(b, "GDR_BENCH_CAPACITY", 0, 1) // 0 (unset): the shipped pools file's
	in := installKEDAWith(ctx, b, installOptions{podTemplate: burstRequests, nodes: nodes, capacity: capacity})
	repo := in.g.CreateRepo(b, "burst")
	floor := startFloor(ctx, b, in.g)
	seen := newSightings()
	go seen.watchJobs(ctx, b, in)
	peak := newPodPeak()
	go peak.watch(ctx, b, in)

	b.ResetTimer()
	for _, n := range sizes {
		b.StopTimer()
		in.waitZero(ctx, b, 10*time.Minute)
		peak.reset()
		b.StartTimer()
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("burst%d-%d", n, i)
		}
		pushed := pushWithTwins(b, in, repo, "ubuntu-latest", names...)
		started := in.waitRunningWithin(ctx, b, repo, pushed, 15*time.Minute, 500*time.Millisecond, names...)
		var total, twin []time.Duration
		for _, name := range names {
			total = append(total, started[name].Sub(pushed))
			twin = append(twin, floor.claimed(b, twinJob(name)).Sub(pushed))
		}
		b.StopTimer()
		in.idleWithin(ctx, b, repo, 15*time.Minute, names...)
		most, pending, perNode := peak.get()
		sec := func(d time.Duration) string { return fmt.Sprintf("%.1f", d.Seconds()) }
		b.Logf("cluster burst %d on %d node(s), capacity %d (0: shipped): push -> first step p50 %s p95 %s max %s s; floor (twins claimed) p50 %s p95 %s max %s s; "+
			"at most %d executor Pods at once, %d Pending then; %d handle Jobs; executors per node %v",
			n, nodes, capacity, sec(p50(total)), sec(p95(total)), sec(slices.Max(total)), sec(p50(twin)), sec(p95(twin)), sec(slices.Max(twin)),
			most, pending, seen.jobsAfter(pushed), perNode)
		for _, m := range []struct {
			unit string
			d    time.Duration
		}{{"p50", p50(total)}, {"p95", p95(total)}, {"max", slices.Max(total)}, {"floor-p95", p95(twin)}} {
			b.ReportMetric(float64(m.d.Milliseconds()), fmt.Sprintf("burst%d-%s-ms", n, m.unit))
		}
		b.StartTimer()
	}
}

// burstRequests lowers the requests of every container of the pool's Pod
// template to 10m CPU and 64 MiB (limits as shipped), so the test node admits
// a burst at once (BenchmarkE2EClusterBurst says why).
func burstRequests(spec map[string]any) {
	containers, _ := spec["containers"].([]any)
	for _, c := range containers {
		c := c.(map[string]any)
		res, _ := c["resources"].(map[string]any)
		if res == nil {
			res = map[string]any{}
			c["resources"] = res
		}
		res["requests"] = map[string]any{"cpu": "10m", "memory": "64Mi"}
	}
}

// podPeak follows the executor Pods and keeps the most that existed at once
// since reset, how many of those were Pending, and how many were bound to
// each node.
type podPeak struct {
	mu      sync.Mutex
	most    int
	pending int
	perNode map[string]int
}

func newPodPeak() *podPeak { return &podPeak{perNode: map[string]int{}} }

func (p *podPeak) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.most, p.pending, p.perNode = 0, 0, map[string]int{}
}

func (p *podPeak) get() (most, pending int, perNode map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.most, p.pending, maps.Clone(p.perNode)
}

// watch lists the executor Pods every 250 ms until ctx ends.
func (p *podPeak) watch(ctx context.Context, tb testing.TB, in *installation) {
	bound := map[string]string{} // Pod -> node, each Pod counted once
	for ctx.Err() == nil {
		pods, err := in.cs.CoreV1().Pods(jobsNamespace).List(ctx, metav1.ListOptions{LabelSelector: executorSelector})
		if err == nil {
			pending := 0
			p.mu.Lock()
			for _, pod := range pods.Items {
				if pod.Spec.NodeName == "" {
					pending++
				} else if _, ok := bound[pod.Name]; !ok {
					bound[pod.Name] = pod.Spec.NodeName
					p.perNode[pod.Spec.NodeName]++
				}
			}
			if len(pods.Items) > p.most {
				p.most, p.pending = len(pods.Items), pending
			}
			p.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}
