package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
// Four binaries run side by side, in the same loop, each with a message of
// its own waiting: handle for the process backend (-tags gdr_process, see
// shared/backend/linked: median-ms, peak-RSS-MiB), handle with every backend linked
// (the image's build: all-median-ms, all-peak-RSS-MiB), the reference
// testdata/fetchack (connect, bind the consumer, fetch one message, ack,
// flush, exit: the floor of a one-shot JetStream handler; ref-median-ms,
// ref-peak-RSS-MiB), and the same reference linking what the pod backend
// links (-tags fetchack_pod: client-go and gRPC, initialised and unused;
// refpod-median-ms, refpod-peak-RSS-MiB). All are built as the images build
// them (buildStatic), and timed and measured by testdata/peakrss, from its
// exec of the binary to the binary's exit.
//
//	go test -run '^$' -bench ColdStart -benchtime 20x ./functions/handle/
func BenchmarkColdStart(b *testing.B) {
	dir := b.TempDir()
	bin, all := filepath.Join(dir, "handle"), filepath.Join(dir, "handle-all")
	ref, refPod, peakrss := filepath.Join(dir, "fetchack"), filepath.Join(dir, "fetchack-pod"), filepath.Join(dir, "peakrss")
	buildStatic(b, ".", bin, "gdr_process")
	buildStatic(b, ".", all, "")
	buildStatic(b, "./testdata/fetchack", ref, "")
	buildStatic(b, "./testdata/fetchack", refPod, "fetchack_pod")
	buildStatic(b, "./testdata/peakrss", peakrss, "")
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
	var handle, handleAll, fetchack, fetchackPod coldRuns
	publish := func(task int64) {
		id, _ := taskidentity.New(td, "alice/repo", "build", task)
		a, _ := taskassignment.New(taskassignment.BackendProcess, taskassignment.Task{ID: task, Pool: "linux"}, id)
		if _, err := q.Publish(ctx, a); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	task := int64(0)
	for range b.N {
		for _, r := range []struct {
			runs *coldRuns
			bin  string
		}{{&handle, bin}, {&handleAll, all}, {&fetchack, ref}, {&fetchackPod, refPod}} {
			b.StopTimer()
			task++
			publish(task)
			b.StartTimer()
			r.runs.run(b, peakrss, r.bin, env)
		}
	}
	b.StopTimer()
	if n, err := q.Outstanding(ctx, taskassignment.BackendProcess); err != nil || n != 0 {
		b.Fatalf("%d messages not acknowledged (%v)", n, err)
	}
	b.ReportMetric(handle.medianMs(), "median-ms")
	b.ReportMetric(handle.peakMiB(), "peak-RSS-MiB")
	b.ReportMetric(handleAll.medianMs(), "all-median-ms")
	b.ReportMetric(handleAll.peakMiB(), "all-peak-RSS-MiB")
	b.ReportMetric(fetchack.medianMs(), "ref-median-ms")
	b.ReportMetric(fetchack.peakMiB(), "ref-peak-RSS-MiB")
	b.ReportMetric(fetchackPod.medianMs(), "refpod-median-ms")
	b.ReportMetric(fetchackPod.peakMiB(), "refpod-peak-RSS-MiB")
	b.Logf("%d runs each, median exec -> exit and peak RSS: handle -tags gdr_process %.1f ms %.1f MiB; handle, every backend %.1f ms %.1f MiB; "+
		"fetch+ack reference %.1f ms %.1f MiB; the reference linking the pod backend's clients %.1f ms %.1f MiB",
		b.N, handle.medianMs(), handle.peakMiB(), handleAll.medianMs(), handleAll.peakMiB(), fetchack.medianMs(), fetchack.peakMiB(),
		fetchackPod.medianMs(), fetchackPod.peakMiB())
}

// buildStatic builds pkg into out with build tags tags (none: "") as
// internal/imagebuild builds an image's binary: CGO_ENABLED=0, -trimpath,
// -ldflags=-s -w.
func buildStatic(b *testing.B, pkg, out, tags string) {
	b.Helper()
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-tags", tags, "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
}

// coldRuns are the exec -> exit times and the peak RSS of one binary's runs.
type coldRuns struct {
	times  []time.Duration
	maxRSS int64 // KiB
}

// run execs bin with env once through peakrss (see testdata/peakrss: a
// child of this process would report this process's RSS), waits for it to
// exit 0 and records its exec -> exit time and peak RSS.
func (r *coldRuns) run(b *testing.B, peakrss, bin string, env []string) {
	b.Helper()
	cmd := exec.Command(peakrss, bin)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("%s: %v\n%s", filepath.Base(bin), err, stderr.Bytes())
	}
	var ns, kib int64
	if _, err := fmt.Sscanf(string(out), "%d %d", &ns, &kib); err != nil {
		b.Fatalf("peakrss %s: %q: %v", filepath.Base(bin), out, err)
	}
	r.times = append(r.times, time.Duration(ns))
	r.maxRSS = max(r.maxRSS, kib)
}

func (r *coldRuns) medianMs() float64 {
	t := slices.Sorted(slices.Values(r.times))
	return float64(t[len(t)/2].Microseconds()) / 1000
}

func (r *coldRuns) peakMiB() float64 { return float64(r.maxRSS) / 1024 }
