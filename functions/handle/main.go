// Command handle hands queued assignments to an executor backend: one
// JetStream message (KEDA job mode) or one CloudEvent (Knative http mode) at a
// time, each to executor.Worker.Accept. It keeps nothing between runs.
//
// Exit status: 0 when it ran (whatever became of single messages, which are
// settled and logged), 1 when it could not run, 2 for bad configuration.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/linked"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/health"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/pull"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/push"
)

func main() {
	os.Exit(execute(context.Background(), os.Args[1:], os.Stderr))
}

// execute runs the command line args and returns the exit code.
func execute(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "keys" {
		return keys(ctx, args, os.Stdout, stderr)
	}
	var cfg Config
	return program.Exec(ctx, &cfg, args, stderr, func(ctx context.Context, log *slog.Logger, _ []string) error {
		return serve(ctx, cfg, log.With(slog.String("backend", cfg.Backend)))
	})
}

func serve(ctx context.Context, cfg Config, log *slog.Logger) error {
	backend := taskassignment.BackendKind(cfg.Backend)
	if cfg.Mode == modeHTTP {
		// The Knative path has no NATS connection, hence no end marks: a
		// redelivered event after its task ended can create an executor
		// again, which finds no payload and ends (docs/ARCHITECTURE.md,
		// "The Knative path").
		h, closeBackend, err := newHandler(cfg, nil, log)
		if err != nil {
			return err
		}
		defer func() { _ = closeBackend() }()
		reg := metrics.NewRegistry()
		h.Observer = metrics.NewOutcomes(reg)
		return serveHTTP(ctx, cfg.HTTPAddr, push.Assignments{Decider: h, Log: log}, reg, log)
	}
	nc, js, err := natsconn.Connect(ctx, cfg.ConnSettings, "handle-"+cfg.Backend)
	if err != nil {
		return err
	}
	// Close flushes the naks and terminations still in flight before exit
	// (acks are confirmed as they are sent).
	defer func() {
		if err := natsconn.Close(nc); err != nil {
			log.Warn("settlements may not have reached NATS: their messages come back after the ack wait", slog.Any("error", err))
		}
	}()
	q := assignmentqueue.New(js, cfg.Stream).Replicated(cfg.Replicas)
	if cfg.Mode == modeSetup {
		if err := q.EnsureStream(ctx); err != nil {
			return err
		}
		if err := assignmentqueue.NewFinished(js, cfg.Stream).Replicated(cfg.Replicas).Ensure(ctx, backend); err != nil { // finish notices
			return err
		}
		if err := q.EnsureRejections(ctx); err != nil {
			return err
		}
		if _, err := q.OpenConsumer(ctx, backend, cfg.MaxInFlight); err != nil {
			return err
		}
		log.Info("stream and consumer ready", slog.String("stream", q.Stream()), slog.Int("max_in_flight", cfg.MaxInFlight))
		return nil
	}
	// Job mode only binds the consumer setup made: its NATS user may
	// consume, never create or change a stream or a consumer (which could
	// source the payload bucket into its own subject).
	consumer, err := q.Consumer(ctx, backend)
	if err != nil {
		return fmt.Errorf("%w (has handle run with GDR_MODE=setup?)", err)
	}
	endings, err := assignmentqueue.OpenEndings(ctx, js, assignmentqueue.EndingsBucket(cfg.PayloadBucket))
	if err != nil {
		return err
	}
	h, closeBackend, err := newHandler(cfg, endings, log)
	if err != nil {
		return err
	}
	defer func() { _ = closeBackend() }()
	return runJob(ctx, cfg, h, consumer, log)
}

// pushJob is the Pushgateway job label of handle's job-mode runs.
const pushJob = "gdr-handle"

// runJob is one job-mode run: it settles consumer's messages with h
// (pull.Assignments), logs its one summary line and, with
// GDR_METRICS_PUSH_URL, pushes the outcomes it counted
// (gdr_assignments_total) to the Pushgateway as it ends: no Prometheus
// scrapes a Job that lives seconds.
func runJob(ctx context.Context, cfg Config, h handler.Handler, consumer jetstream.Consumer, log *slog.Logger) error {
	reg := prometheus.NewRegistry() // the run's own figures: no runtime collectors to push
	h.Observer = metrics.NewOutcomes(reg)
	defer cfg.PushAtExit(ctx, pushJob, reg, log)
	job := pull.Assignments{
		Decider: h, Log: log,
		Consumer: consumer, Batch: cfg.Batch, Wait: cfg.FetchWait, HoldFor: cfg.HoldFor,
		Linger: cfg.Linger, LingerMax: cfg.LingerMax,
	}
	sum, err := job.Run(ctx)
	log.Info("run finished", slog.Int("fetched", sum.Fetched), slog.Int("accepted", sum.Accepted),
		slog.Int("not_yet", sum.NotYet), slog.Int("failed", sum.Failed), slog.Int("poison", sum.Poison), slog.Int("rejected", sum.Rejected))
	return err
}

// newHandler builds the handler of the configured backend: its worker (with
// endings, the end marks a redelivered message is checked against; nil for
// none), and the keys every message is authenticated with. The returned
// function releases what the backend holds open.
func newHandler(cfg Config, endings executor.Endings, log *slog.Logger) (handler.Handler, func() error, error) {
	td, keys, err := cfg.Parse()
	if err != nil {
		return handler.Handler{}, nil, err
	}
	boot, err := cfg.Settings.New(td)
	if err != nil {
		return handler.Handler{}, nil, err
	}
	ring, err := cfg.Keyring()
	if err != nil {
		return handler.Handler{}, nil, err
	}
	backend, closeBackend, err := linked.Backends().New(taskassignment.BackendKind(cfg.Backend), cfg.BuildSettings,
		backend.Deps{Keys: keys, TrustDomain: td, Pools: cfg.pools, Log: log})
	if err != nil {
		return handler.Handler{}, nil, err
	}
	worker := executor.Worker{
		Backend: backend, Bootstrap: boot, Keys: keys, Endings: endings,
		OnEvent: func(e executor.Event) {
			log.Debug(string(e.Name), slog.String("assignment", e.AssignmentID), slog.String("executor", e.Executor), slog.String("phase", string(e.Phase)))
		},
	}
	return handler.Handler{Worker: worker, TrustDomain: td, Keys: ring, NotYetDelay: cfg.NakDelay, ErrorDelay: cfg.ErrorDelay}, closeBackend, nil
}

func serveHTTP(ctx context.Context, addr string, r push.Assignments, g prometheus.Gatherer, log *slog.Logger) error {
	h, err := httpHandler(ctx, r, g, log)
	if err != nil {
		return err
	}
	log.Info("serving CloudEvents", slog.String("addr", addr))
	return function.ListenAndServe(ctx, function.Server(h, push.MaxEventBytes), addr)
}

// httpHandler serves CloudEvents at / (any other path too: Knative posts
// to /), readiness at GET /healthz and liveness at GET /livez (this mode
// holds no NATS connection: nothing to check but the process), and g's
// metrics at GET /metrics.
func httpHandler(ctx context.Context, r push.Assignments, g prometheus.Gatherer, log *slog.Logger) (http.Handler, error) {
	events, err := r.NewHTTPHandler(ctx)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	health.Probes{Log: log}.Register(mux)
	metrics.Register(mux, g)
	mux.Handle("/", events)
	return mux, nil
}
