// Command handle hands queued assignments to an executor backend: one
// JetStream message (KEDA job mode) or one CloudEvent (Knative http mode) at a
// time, each to taskworker.Worker.Accept. It keeps nothing between runs.
//
// Exit status: 0 when it ran (whatever became of single messages, which are
// settled and logged), 1 when it could not run, 2 for bad configuration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backends"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/intake"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskworker"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: handle\n\nConfigured by environment variables:\n")
		_ = envdoc.Usage(flag.CommandLine.Output(), envPrefix, &Config{})
	}
	flag.Parse()
	os.Exit(run())
}

func run() int {
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "handle: configuration: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel})).
		With(slog.String("function", "handle"), slog.String("backend", cfg.Backend))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("handle could not run", slog.Any("error", err))
		return 1
	}
	return 0
}

func serve(ctx context.Context, cfg Config, log *slog.Logger) error {
	backend := taskassignment.Backend(cfg.Backend)
	if cfg.Mode == modeHTTP {
		worker, td, err := newWorker(ctx, cfg, log)
		if err != nil {
			return err
		}
		return serveHTTP(ctx, cfg.HTTPAddr, intake.Receiver{Handler: intake.Handler{Worker: worker, TrustDomain: td, Log: log}}, log)
	}
	nc, js, err := natsconn.Connect(ctx, cfg.Config, "handle-"+cfg.Backend)
	if err != nil {
		return err
	}
	// Close flushes the acks, naks and terminations still in flight before exit.
	defer func() { _ = natsconn.Close(nc) }()
	q := assignmentqueue.New(js, cfg.Stream)
	if err := q.EnsureStream(ctx); err != nil {
		return err
	}
	consumer, err := q.OpenConsumer(ctx, backend, cfg.Capacity)
	if err != nil {
		return err
	}
	if cfg.Mode == modeSetup {
		log.Info("stream and consumer ready", slog.String("stream", q.Stream()), slog.Int("capacity", cfg.Capacity))
		return nil
	}
	worker, td, err := newWorker(ctx, cfg, log)
	if err != nil {
		return err
	}
	job := intake.Job{
		Handler:  intake.Handler{Worker: worker, TrustDomain: td, Log: log},
		Consumer: consumer, Batch: cfg.Batch, Wait: cfg.FetchWait, NakDelay: cfg.NakDelay, ErrorDelay: cfg.ErrorDelay,
	}
	sum, err := job.Run(ctx)
	log.Info("run finished", slog.Int("fetched", sum.Fetched), slog.Int("accepted", sum.Accepted),
		slog.Int("not_yet", sum.NotYet), slog.Int("failed", sum.Failed), slog.Int("poison", sum.Poison))
	return err
}

func newWorker(ctx context.Context, cfg Config, log *slog.Logger) (taskworker.Worker, spiffeid.TrustDomain, error) {
	td, keys, err := cfg.Parse()
	if err != nil {
		return taskworker.Worker{}, td, err
	}
	boot, err := cfg.Settings.New()
	if err != nil {
		return taskworker.Worker{}, td, err
	}
	pools, err := cfg.Source.Load()
	if err != nil {
		return taskworker.Worker{}, td, err
	}
	backend, err := backends.New(ctx, taskassignment.Backend(cfg.Backend), cfg.Setup, keys, td, pools, log)
	if err != nil {
		return taskworker.Worker{}, td, err
	}
	return taskworker.Worker{
		Backend: backend, Bootstrap: boot, Keys: keys,
		OnEvent: func(e taskworker.Event) {
			log.Debug(string(e.Name), slog.String("assignment", e.AssignmentID), slog.String("executor", e.Executor), slog.String("phase", string(e.Phase)))
		},
	}, td, nil
}

func serveHTTP(ctx context.Context, addr string, r intake.Receiver, log *slog.Logger) error {
	h, err := r.NewHTTPHandler(ctx)
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("serving CloudEvents", slog.String("addr", addr))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
