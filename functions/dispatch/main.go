// Command dispatch claims tasks from Gitea for the configured runner pools
// and queues one assignment per task; it also keeps claimed tasks that wait
// for an executor alive in Gitea.
//
//	dispatch register          register every pool that has no credentials yet
//	dispatch run [-pool NAME]  one round for every pool (or one): a CronJob, a manual run
//	dispatch serve             HTTP: Gitea's workflow_job webhook at /webhook, a schedule
//	                           tick (Knative PingSource, any POST) at /, health at /healthz
//
// Exit status: 0 when everything asked for was done, 1 when something could
// not be (the log says what), 2 for bad configuration or usage.
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
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

const usage = `usage: dispatch register | run [-pool NAME] | serve

Configured by environment variables:
`

func main() {
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), usage)
		_ = envdoc.Usage(flag.CommandLine.Output(), envPrefix, &Config{})
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx, flag.Args()))
}

func run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		flag.Usage()
		return 2
	}
	cfg, pools, err := loadConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "dispatch: configuration: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel})).
		With(slog.String("function", "dispatch"))
	hc := &http.Client{Timeout: 30 * time.Second}
	switch cmd := args[0]; cmd {
	case "register":
		if err := register(ctx, cfg, pools, hc, log); err != nil {
			log.Error("register failed", slog.Any("error", err))
			return 1
		}
		return 0
	case "run", "serve":
		fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
		only := fs.String("pool", "", "dispatch only this pool")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		if *only != "" {
			p, err := pools.Get(*only)
			if err != nil {
				fmt.Fprintf(os.Stderr, "dispatch: -pool: %v\n", err)
				return 2
			}
			pools = runnerpool.Pools{p}
		}
		svc, closeFn, err := newService(ctx, cfg, pools, hc, log)
		if err != nil {
			log.Error("dispatch could not start", slog.Any("error", err))
			return 1
		}
		defer closeFn()
		if cmd == "run" {
			if err := svc.dispatchAll(ctx, svc.pools); err != nil {
				return 1
			}
			return 0
		}
		if err := svc.serve(ctx, cfg.HTTPAddr, cfg.Interval); err != nil {
			log.Error("serve failed", slog.Any("error", err))
			return 1
		}
		return 0
	default:
		fmt.Fprintf(os.Stderr, "dispatch: unknown command %q\n", cmd)
		flag.Usage()
		return 2
	}
}

// register registers every pool that has no credentials yet. A pool that
// has them is left alone, so it is safe to run again.
func register(ctx context.Context, cfg Config, pools runnerpool.Pools, hc *http.Client, log *slog.Logger) error {
	var errs []error
	for _, p := range pools {
		store := gitea.FileStore{Path: p.Credentials}
		_, err := store.Load()
		if err == nil {
			log.Info("pool already registered", slog.String("pool", p.Name))
			continue
		}
		if !errors.Is(err, gitea.ErrNoCredentials) {
			errs = append(errs, fmt.Errorf("pool %s: %w", p.Name, err))
			continue
		}
		if cfg.RegistrationToken == "" {
			errs = append(errs, fmt.Errorf("pool %s: GDR_REGISTRATION_TOKEN is not set", p.Name))
			continue
		}
		creds, err := gitea.Register(ctx, cfg.GiteaURL, hc, gitea.Registration{
			Token: cfg.RegistrationToken, Name: cfg.RunnerName + "-" + p.Name, Labels: p.Labels,
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", p.Name, err))
			continue
		}
		if err := store.Save(creds); err != nil {
			errs = append(errs, fmt.Errorf("pool %s: save credentials: %w", p.Name, err))
			continue
		}
		log.Info("pool registered", slog.String("pool", p.Name), slog.Int64("runner_id", creds.ID))
	}
	return errors.Join(errs...)
}

// newService connects to NATS and Gitea for the pools. The returned function
// drains the NATS connection.
func newService(ctx context.Context, cfg Config, pools runnerpool.Pools, hc *http.Client, log *slog.Logger) (*service, func(), error) {
	td, _, err := cfg.Parse()
	if err != nil {
		return nil, nil, err
	}
	clients, err := gitea.PoolClients(cfg.GiteaURL, hc, pools)
	if err != nil {
		return nil, nil, err
	}
	var dps []dispatcher.Pool
	for _, p := range pools {
		client := clients[p.Name]
		dps = append(dps, dispatcher.Pool{Pool: p, Runner: client, Tasks: gitea.TaskState{Client: client}})
	}
	nc, js, err := natsconn.Connect(ctx, cfg.Config, "dispatch")
	if err != nil {
		return nil, nil, err
	}
	closeFn := func() { _ = natsconn.Close(nc) }
	q := assignmentqueue.New(js, cfg.Stream)
	if err := q.EnsureStream(ctx); err != nil {
		closeFn()
		return nil, nil, err
	}
	payloads, err := assignmentqueue.EnsurePayloads(ctx, js, cfg.PayloadBucket, payloadTTL(pools), cfg.PayloadKey)
	if err != nil {
		closeFn()
		return nil, nil, err
	}
	d := &dispatcher.Dispatcher{TrustDomain: td, Queue: q, Payloads: payloads, Log: log, KeepAlive: cfg.KeepAlive}
	return newHTTPService(d, dps, []byte(cfg.WebhookSecret), log), closeFn, nil
}
