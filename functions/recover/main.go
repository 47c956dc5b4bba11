// Command recover finishes, reports and cleans up whatever the backends hold
// (see package recovery): one pass, then exit. Run it as a CronJob, from a
// Knative PingSource (GDR_MODE=http: every POST runs a pass), or by hand.
//
// Exit status: 0 when the pass ran (single assignments that failed are
// logged and retried by the next pass), 1 when it could not run at all, 2 for
// bad configuration.
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

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backends"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recovery"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

const envPrefix = "GDR"

// Config is the configuration of recover, read from GDR_* variables.
type Config struct {
	natsconn.Config
	taskassignment.Naming
	gitea.Instance
	runnerpool.Source
	assignmentqueue.PayloadStore
	bootstrap.Settings
	backends.Setup

	Stream      string     `envconfig:"STREAM" default:"CI_RUNNER" desc:"JetStream stream of assignments"`
	Mode        string     `envconfig:"RECOVER_MODE" default:"once" desc:"recover: once (one pass, then exit: CronJob, manual Job) or http (a pass per POST: Knative PingSource)"`
	HTTPAddr    string     `envconfig:"HTTP_ADDR" default:":8080" desc:"listen address of the HTTP server (handle: http mode only)"`
	Concurrency int        `envconfig:"RECOVER_CONCURRENCY" default:"8" desc:"recover: assignments handled at once"`
	LogLevel    slog.Level `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
}

func loadConfig() (Config, runnerpool.Pools, error) {
	var c Config
	if err := envdoc.Process(envPrefix, &c); err != nil {
		return Config{}, nil, err
	}
	var errs []error
	if _, _, err := c.Parse(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.Settings.New(); err != nil {
		errs = append(errs, err)
	}
	if err := c.PayloadStore.Check(); err != nil {
		errs = append(errs, err)
	}
	if c.Mode != "once" && c.Mode != "http" {
		errs = append(errs, fmt.Errorf("GDR_RECOVER_MODE %q: want once or http", c.Mode))
	}
	pools, err := c.Source.Load()
	if err != nil {
		errs = append(errs, err)
	}
	return c, pools, errors.Join(errs...)
}

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: recover\n\nConfigured by environment variables:\n")
		_ = envdoc.Usage(flag.CommandLine.Output(), envPrefix, &Config{})
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx))
}

func run(ctx context.Context) int {
	cfg, pools, err := loadConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "recover: configuration: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel})).With(slog.String("function", "recover"))
	r, closeFn, err := build(ctx, cfg, pools, log)
	if err != nil {
		log.Error("recover could not start", slog.Any("error", err))
		return 1
	}
	defer closeFn()
	if cfg.Mode == "http" {
		if err := serve(ctx, cfg.HTTPAddr, r, log); err != nil {
			log.Error("serve failed", slog.Any("error", err))
			return 1
		}
		return 0
	}
	if err := pass(ctx, r, log); err != nil {
		return 1
	}
	return 0
}

// pass runs once and logs one summary line.
func pass(ctx context.Context, r *recovery.Recovery, log *slog.Logger) error {
	sum, err := r.Run(ctx)
	if err != nil {
		log.Error("recover pass incomplete", append(sum.Attrs(), slog.Any("error", err))...)
		return err
	}
	log.Info("recover pass", sum.Attrs()...)
	return nil
}

func build(ctx context.Context, cfg Config, pools runnerpool.Pools, log *slog.Logger) (*recovery.Recovery, func(), error) {
	td, keys, err := cfg.Parse()
	if err != nil {
		return nil, nil, err
	}
	boot, err := cfg.Settings.New()
	if err != nil {
		return nil, nil, err
	}
	clients, err := gitea.PoolClients(cfg.GiteaURL, &http.Client{Timeout: 30 * time.Second}, pools)
	if err != nil {
		return nil, nil, err
	}
	rp := map[string]recovery.Pool{}
	bs := map[taskassignment.Backend]recovery.Backend{}
	for _, p := range pools {
		rp[p.Name] = recovery.Pool{Pool: p, Tasks: gitea.TaskState{Client: clients[p.Name]}}
		if _, ok := bs[p.Backend]; ok {
			continue
		}
		b, err := backends.New(ctx, p.Backend, cfg.Setup, keys, td, pools, log)
		if err != nil {
			return nil, nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		bs[p.Backend] = b
	}
	nc, js, err := natsconn.Connect(ctx, cfg.Config, "recover")
	if err != nil {
		return nil, nil, err
	}
	closeFn := func() { _ = natsconn.Close(nc) }
	payloads, err := assignmentqueue.OpenPayloads(ctx, js, cfg.PayloadBucket, cfg.PayloadKey)
	if err != nil {
		closeFn()
		return nil, nil, err
	}
	return &recovery.Recovery{
		TrustDomain: td, Keys: keys, Bootstrap: boot, Backends: bs, Pools: rp,
		Queue: assignmentqueue.New(js, cfg.Stream), Payloads: payloads, Concurrency: cfg.Concurrency, Log: log,
	}, closeFn, nil
}

// serve runs a pass per POST (a PingSource tick) until ctx ends.
func serve(ctx context.Context, addr string, r *recovery.Recovery, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /{$}", func(w http.ResponseWriter, req *http.Request) {
		if err := pass(req.Context(), r, log); err != nil {
			http.Error(w, "recover pass incomplete; see the log", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}
