//go:build e2e

package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// BenchmarkE2EPickup measures pickup latency against a real Gitea: from a
// push (a workflow commit through the contents API, which itself takes about
// 1.4 s) to the job's assignment being published, b.N jobs one after
// another. It reports p50 and p95 from the commit's return, and from the
// start of the push call, for two triggers: Gitea's workflow_job webhook, and
// polling every 2 s (act_runner's default, and local mode's until it polled
// every 500 ms).
//
//	go test -tags e2e -run '^$' -bench E2EPickup -benchtime 20x ./functions/dispatch/
func BenchmarkE2EPickup(b *testing.B) {
	for _, trigger := range []string{"webhook", "poll-2s"} {
		b.Run(trigger, func(b *testing.B) {
			e := setupB(b, 1000)
			published := make(chan time.Time, 100)
			sub, err := e.nc.Subscribe(assignmentqueue.Subject(taskassignment.BackendProcess), func(*nats.Msg) { published <- time.Now() })
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Unsubscribe()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			switch trigger {
			case "webhook":
				srv := httptest.NewServer(e.svc.handler())
				defer srv.Close()
				e.gitea.AddSystemWebhook(b, srv.URL+"/webhook", webhookSecret)
			default:
				go func() {
					tick := time.NewTicker(2 * time.Second)
					defer tick.Stop()
					for {
						select {
						case <-ctx.Done():
							return
						case <-tick.C:
							_ = e.svc.dispatchAll(ctx, e.svc.pools)
						}
					}
				}()
			}
			var fromCall, fromCommit []time.Duration
			b.ResetTimer()
			for i := range b.N {
				// One workflow file, rewritten: each push starts exactly one job.
				start := time.Now()
				e.gitea.PushWorkflow(b, e.repo, ".gitea/workflows/ci.yml", workflow(fmt.Sprintf("j%d", i)))
				committed := time.Now()
				select {
				case at := <-published:
					fromCall = append(fromCall, at.Sub(start))
					fromCommit = append(fromCommit, at.Sub(committed))
				case <-time.After(30 * time.Second):
					b.Fatalf("job %d never published", i)
				}
			}
			b.StopTimer()
			report(b, fromCommit, "")
			report(b, fromCall, "-incl-push-call")
		})
	}
}

// report adds the p50 and p95 of lat, in milliseconds, to b's metrics.
func report(b *testing.B, lat []time.Duration, suffix string) {
	slices.Sort(lat)
	p95 := (len(lat)*95+99)/100 - 1
	b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "p50-ms"+suffix)
	b.ReportMetric(float64(lat[p95].Milliseconds()), "p95-ms"+suffix)
}

// setupB is setup for a benchmark: the default Gitea queue (not the
// in-memory channel queue), as a production Gitea runs.
func setupB(b *testing.B, capacity int) *e2e {
	b.Helper()
	return setupWith(b, capacity, giteaenv.Options{})
}
