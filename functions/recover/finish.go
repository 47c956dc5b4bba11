package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/pull"
)

// modeFinish is GDR_RECOVER_MODE=finish.
const modeFinish = "finish"

// finish is one finish-mode run: for each backend of the pools file, one
// batch of finish notices from the backend's durable consumer, each notice
// settled (pull.Notices deciding with recoverer.NoticeHandler), then exit. The backends' batches run side by
// side. It only binds the consumers: handle-setup creates them
// (assignmentqueue.Finished.Ensure), as it creates the queue's, so recover's
// NATS user needs no right to create or change a consumer.
//
// It holds nothing across runs: a run that is killed leaves its notices to
// come back after the consumer's ack wait, and every notice it settles is
// re-checked against Gitea and the backend (recoverer.Finish).
func finish(ctx context.Context, cfg Config, r *recoverer.Recoverer, js jetstream.JetStream, log *slog.Logger) error {
	finished := assignmentqueue.NewFinished(js, cfg.Stream)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for _, b := range sortedBackends(r) {
		consumer, err := finished.Consumer(ctx, b)
		if err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("%w (has handle run with GDR_MODE=setup for backend %s?)", err, b))
			mu.Unlock()
			continue
		}
		n := pull.Notices{
			Decider: recoverer.NoticeHandler{Recoverer: r, Backend: b, Executors: recoverer.Listed(r.Backends[b]), Retry: cfg.Retry},
			Backend: b, Consumer: consumer, Log: log, Batch: cfg.Batch, Wait: cfg.FetchWait,
		}
		wg.Go(func() {
			sum, err := n.Run(ctx)
			log.Info("finish notices", slog.String("backend", string(b)), slog.Int("fetched", sum.Fetched),
				slog.Int("finished", sum.Finished), slog.Int("absent", sum.Absent), slog.Int("retried", sum.Retried),
				slog.Int("dropped", sum.Dropped))
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// sortedBackends are the backends of the configured pools, in a fixed order.
func sortedBackends(r *recoverer.Recoverer) []taskassignment.BackendKind {
	var bs []taskassignment.BackendKind
	for b := range r.Backends {
		bs = append(bs, b)
	}
	slices.Sort(bs)
	return bs
}
