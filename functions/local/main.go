// Command local runs the whole product in one process on one machine: an
// embedded NATS JetStream server (its store in the state directory),
// dispatch polling Gitea (and, optionally, its webhook), handle consuming the
// queue, recover on a schedule, and the gateway on 127.0.0.1 with a local
// SPIFFE CA that gives each executor its SVID. Executors are child processes
// (the process backend) running this same binary as `local runner`.
//
//	go run ./functions/local --gitea-url http://127.0.0.1:3000/ --registration-token TOKEN
//
// Ctrl-C stops it; running jobs go on in their own processes and are picked
// up again by the next start, which needs no registration token: the
// credentials persist in the state directory.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "runner" {
		os.Exit(executor.Main(os.Args[:2], os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:]))
}

func run(ctx context.Context, args []string) int {
	cfg, err := loadConfig(args)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "local: %v\n", err)
		}
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	l, err := start(ctx, cfg, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "local: %v\n", err)
		return 1
	}
	log.Info("gitea-dynamic-runner is running; Ctrl-C stops it", slog.String("gitea", cfg.GiteaURL),
		slog.Any("labels", cfg.labels()), slog.Int("capacity", cfg.Capacity), slog.String("state", cfg.StateDir))
	l.wait(ctx)
	log.Info("stopped")
	return 0
}
