//go:build e2e

package main

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkE2EExecutorStart measures, against a real Gitea, the executor's
// start-up: from exec of the runner (bootstrap scrub and re-exec, SVID,
// FetchTask through the gateway, act set-up) to Gitea hearing that the first
// step runs. It reports the median over b.N tasks.
//
//	go test -tags e2e -run '^$' -bench E2EExecutorStart -benchtime 10x ./functions/runner/
func BenchmarkE2EExecutorStart(b *testing.B) {
	w := newWorld(b)
	var lat []time.Duration
	for i := range b.N {
		w.gitea.PushWorkflow(b, w.repo, ".gitea/workflows/ci.yml",
			"name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo run "+string(rune('a'+i%26))+"\n")
		a := w.claim(b)
		start := time.Now()
		if code := w.runTask(b, a); code != 0 {
			b.Fatalf("runner exited %d", code)
		}
		w.steps.mu.Lock()
		at, ok := w.steps.seen[a.Task.ID]
		w.steps.mu.Unlock()
		if !ok {
			b.Fatalf("task %d never reported a running step", a.Task.ID)
		}
		lat = append(lat, at.Sub(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "median-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Milliseconds()), "max-ms")
}
