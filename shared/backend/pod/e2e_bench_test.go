//go:build e2e

package pod

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// recoverPods is the size of the recover benchmark's namespace.
const recoverPods = 10_000

// BenchmarkE2ERecover measures RecoverAssignments over 10,000 executor Pods
// on a real kube-apiserver: wall time per full recovery, and API calls per
// recovery (pages; no corrupt Pods, so no extra work). The sub-benchmarks
// vary the page size and the wire format (client-go's default JSON, and
// protobuf, which a deployment can choose with rest.Config.ContentType).
//
//	go test -tags e2e -run '^$' -bench E2ERecover -benchtime 5x ./shared/backend/pod/
func BenchmarkE2ERecover(b *testing.B) {
	env := newEnv(b)
	start := time.Now()
	seedPods(b, env, recoverPods)
	b.Logf("seeded %d Pods in %s", recoverPods, time.Since(start).Round(time.Millisecond))
	for _, tc := range []struct {
		pageSize int64
		protobuf bool
	}{{500, false}, {500, true}, {1000, true}, {250, true}} {
		format := "json"
		if tc.protobuf {
			format = "protobuf"
		}
		b.Run(fmt.Sprintf("page=%d/%s", tc.pageSize, format), func(b *testing.B) {
			var calls atomic.Int64
			rc := env.plane.RESTConfig()
			if tc.protobuf {
				rc.ContentType = runtime.ContentTypeProtobuf
				rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
			}
			cfg := env.config(nil)
			cfg.Client = countingClient(b, rc, &calls)
			cfg.PageSize = tc.pageSize
			rb, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ResetTimer()
			calls.Store(0)
			for i := 0; i < b.N; i++ {
				got, err := rb.RecoverAssignments(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if len(got) != recoverPods {
					b.Fatalf("recovered %d, want %d", len(got), recoverPods)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(calls.Load())/float64(b.N), "calls/op")
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
		})
	}
	// Find lists by label selector: its cost grows with the namespace.
	b.Run("find", func(b *testing.B) {
		var calls atomic.Int64
		rc := env.plane.RESTConfig()
		rc.ContentType = runtime.ContentTypeProtobuf
		cfg := env.config(nil)
		cfg.Client = countingClient(b, rc, &calls)
		fb, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.ResetTimer()
		calls.Store(0)
		for i := 0; i < b.N; i++ {
			id := fmt.Sprintf("linux-%d", 1+i%recoverPods)
			if _, err := fb.Find(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(calls.Load())/float64(b.N), "calls/op")
	})
}

// seedPods creates n executor Pods (tasks 1..n) directly, 32 at a time: the
// Pods Create would make, without their Secrets, which recover never reads.
func seedPods(b *testing.B, env e2eEnv, n int) {
	b.Helper()
	rc := env.plane.RESTConfig()
	rc.ContentType = runtime.ContentTypeProtobuf
	be := env.backend(b, nil)
	client := countingClient(b, rc, new(atomic.Int64))
	ctx := context.Background()
	next := atomic.Int64{}
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				id := next.Add(1)
				if id > int64(n) {
					return
				}
				a, err := newAssignment(id, "")
				var pod *corev1.Pod
				if err == nil {
					pod, err = be.newPod(a, launch(env.keys, a), be.pools["linux"])
				}
				if err == nil {
					_, err = client.CoreV1().Pods(env.ns).Create(ctx, pod, metav1.CreateOptions{})
				}
				if err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}
