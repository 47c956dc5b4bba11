package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jetstreamtest"
)

// BenchmarkColdStart execs the handle binary b.N times against an embedded
// NATS server and reports the median wall time from exec to exit and the
// peak RSS of any run. The binary runs in setup mode: configuration,
// connection, stream and consumer converged, exit 0, which is everything a
// KEDA job does before its first fetch. (Exec to first ack needs a real
// backend in the binary; it is measured once the first backend lands.)
func BenchmarkColdStart(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "handle")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	_, url := jetstreamtest.Start(b)
	env := append(os.Environ(),
		"GDR_MODE=setup", "GDR_BACKEND=pod", "GDR_NATS_URL="+url,
		"GDR_TRUST_DOMAIN=ci.example.org", "GDR_BOOTSTRAP_KEY=c2VjcmV0LWtleS1tYXRlcmlhbC0wMTIzNDU2Nzg5YWI=",
		"GDR_GATEWAY_URL=https://gateway.example.org", "GDR_LOG_LEVEL=error")
	var (
		times  []time.Duration
		maxRSS int64
	)
	b.ResetTimer()
	for range b.N {
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
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(maxRSS)/1024, "peak-RSS-MiB")
}
