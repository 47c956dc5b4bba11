//go:build e2e

package main

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
)

// BenchmarkE2ELocalPickup measures local mode's pickup latency against a
// real Gitea (default queue, as in production): from a push (the contents
// API call returning) to Gitea showing the job's first step running, b.N
// jobs one after another, with local mode's default 2 s polling.
//
//	go test -tags e2e -run '^$' -bench E2ELocalPickup -benchtime 20x ./functions/local/
func BenchmarkE2ELocalPickup(b *testing.B) {
	g := giteaenv.Start(b, giteaenv.Options{})
	repo := g.CreateRepo(b, "demo")
	state := b.TempDir()
	cmd := startBench(b, localBinary(b), "--gitea-url", g.URL, "--registration-token-file", tokenFile(b, g.RegistrationToken(b)),
		"--state-dir", state, "--gateway-addr", "127.0.0.1:41449", "--capacity", "4")
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var lat []time.Duration
	for i := range b.N {
		name := fmt.Sprintf("j%d", i)
		g.PushWorkflow(b, repo, ".gitea/workflows/ci.yml",
			"name: ci\non: [push]\njobs:\n  "+name+":\n    runs-on: ubuntu-latest\n    steps:\n      - run: sleep 1\n")
		pushed := time.Now()
		deadline := pushed.Add(60 * time.Second)
		for {
			running := false
			for _, j := range g.Jobs(b, repo) {
				if j.Name == name && len(j.Steps) > 0 && j.Steps[0].Status != "queued" && j.Steps[0].Status != "" {
					running = true
				}
			}
			if running {
				lat = append(lat, time.Since(pushed))
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("job %s never started", name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(lat[(len(lat)*95+99)/100-1].Milliseconds()), "p95-ms")
}
