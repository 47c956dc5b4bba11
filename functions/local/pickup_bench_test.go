//go:build e2e

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
)

// BenchmarkE2ELocalPickup measures local mode's pickup latency against a
// real Gitea (default queue, as in production): from a push (the contents
// API call returning) to Gitea showing the job's first step running, b.N
// jobs one after another, with local mode's default polling
// (GDR_POLL_INTERVAL), at capacity GDR_BENCH_CAPACITY (default 4). Each job is pushed once the one before
// runs, so a capacity below b.N shows how soon a finished job's slot is
// used again.
//
// It also reports finish-p50-ms: from an executor's status file appearing
// (the runner writes it last, then exits) to its directory being gone
// (reported, deleted, its slot free), watched every 10 ms.
//
//	GDR_BENCH_CAPACITY=2 go test -tags e2e -run '^$' -bench E2ELocalPickup -benchtime 10x ./functions/local/
func BenchmarkE2ELocalPickup(b *testing.B) {
	capacity := os.Getenv("GDR_BENCH_CAPACITY")
	if capacity == "" {
		capacity = "4"
	}
	g := giteaenv.Start(b, giteaenv.Options{})
	repo := g.CreateRepo(b, "demo")
	state := b.TempDir()
	cmd := startBench(b, localBinary(b), "--gitea-url", g.URL, "--registration-token-file", tokenFile(b, g.RegistrationToken(b)),
		"--state-dir", state, "--gateway-addr", "127.0.0.1:41449", "--capacity", capacity)
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	finishes := watchFinishes(filepath.Join(state, "executors"))
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
	b.ReportMetric(median(lat), "p50-ms")
	b.ReportMetric(float64(lat[(len(lat)*95+99)/100-1].Milliseconds()), "p95-ms")
	if fin := finishes(); len(fin) > 0 {
		b.ReportMetric(median(fin), "finish-p50-ms")
	}
}

// median sorts ds and returns its upper median in ms.
func median(ds []time.Duration) float64 {
	slices.Sort(ds)
	return float64(ds[len(ds)/2].Milliseconds())
}

// watchFinishes watches the executors directory every 10 ms, from an
// executor's status file appearing to its directory being gone, until the
// returned function is called; that returns the durations seen so far.
func watchFinishes(dir string) func() []time.Duration {
	stop, done := make(chan struct{}), make(chan []time.Duration)
	go func() {
		var out []time.Duration
		ended := map[string]time.Time{}
		for {
			select {
			case <-stop:
				done <- out
				return
			case <-time.After(10 * time.Millisecond):
			}
			now := time.Now()
			for name, at := range ended {
				if _, err := os.Stat(filepath.Join(dir, name)); errors.Is(err, fs.ErrNotExist) {
					out = append(out, now.Sub(at))
					delete(ended, name)
				}
			}
			statuses, _ := filepath.Glob(filepath.Join(dir, "*", "status"))
			for _, s := range statuses {
				if name := filepath.Base(filepath.Dir(s)); ended[name].IsZero() {
					ended[name] = now
				}
			}
		}
	}()
	return func() []time.Duration { close(stop); return <-done }
}
