package main

import (
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// BenchmarkColdStart execs the handle binary b.N times in KEDA job mode,
// each time with one assignment waiting, and reports the median wall time
// from exec to exit and the peak RSS of any run. A run exits right after it
// settled its message, so exec -> exit bounds exec -> first ack. The backend
// is the process backend with /bin/true as the runner: creating the executor
// is a fork and two small files.
//
//	go test -run '^$' -bench ColdStart -benchtime 20x ./functions/handle/
func BenchmarkColdStart(b *testing.B) {
	dir := b.TempDir()
	bin := filepath.Join(dir, "handle")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: process, capacity: 5}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	queue := jetstreamenv.NewQueue(b)
	url, q, ctx := queue.URL, queue.Queue, context.Background()
	queue.OpenConsumer(b, taskassignment.BackendProcess, 10) // what handle's setup mode does once
	verifyKey := base64.StdEncoding.EncodeToString(queue.Signer.Public())
	env := append(os.Environ(), "GDR_ASSIGNMENT_VERIFY_KEYS="+verifyKey,
		"GDR_MODE=job", "GDR_BACKEND=process", "GDR_NATS_URL="+url, "GDR_POOLS_FILE="+pools, "GDR_STATE_DIR="+dir,
		"GDR_TRUST_DOMAIN=ci.example.org", "GDR_BOOTSTRAP_KEY=c2VjcmV0LWtleS1tYXRlcmlhbC0wMTIzNDU2Nzg5YWI=",
		"GDR_GATEWAY_URL=https://gateway.example.org", "GDR_LOG_LEVEL=error", "GDR_FETCH_WAIT=5s",
		"GDR_CA_DIR="+filepath.Join(dir, "ca"), "GDR_PROCESS_DIR="+filepath.Join(dir, "executors"), "GDR_RUNNER_BIN=/bin/true")
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	var (
		times  []time.Duration
		maxRSS int64
	)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		id, _ := taskidentity.New(td, "alice/repo", "build", int64(i+1))
		a, _ := taskassignment.New(taskassignment.BackendProcess, taskassignment.Task{ID: int64(i + 1), Pool: "linux"}, id)
		if _, err := q.Publish(ctx, a); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		cmd := exec.Command(bin)
		cmd.Env = env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		elapsed := time.Since(start)
		if err != nil {
			b.Fatalf("handle: %v\n%s", err, out)
		}
		times = append(times, elapsed)
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			maxRSS = max(maxRSS, ru.Maxrss) // KiB on Linux
		}
	}
	b.StopTimer()
	if n, err := q.Outstanding(ctx, taskassignment.BackendProcess); err != nil || n != 0 {
		b.Fatalf("%d messages not acknowledged (%v)", n, err)
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(maxRSS)/1024, "peak-RSS-MiB")
}
