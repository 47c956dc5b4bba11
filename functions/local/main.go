// Command local runs the whole product in one process on one machine: an
// embedded NATS JetStream server (its store in the state directory),
// dispatch polling Gitea (and, optionally, its webhook), handle consuming the
// queue, each executor finished as its process ends (recover on a schedule is
// the safety net), and the gateway on 127.0.0.1 with a local SPIFFE CA that
// gives each executor its SVID. Executors are child processes (the process
// backend) running this same binary as `local runner`.
//
//	go run ./functions/local --gitea-url http://127.0.0.1:3000/ --registration-token-file FILE
//	go run ./functions/local status [--state-dir DIR] [-o json]
//
// (The registration token is read from a file or the environment, never
// the command line, where every user's ps shows it.) Ctrl-C stops it;
// running jobs go on in their own processes and are picked up again by the
// next start, which needs no registration token: the credentials persist in
// the state directory, which one local mode at a time holds (a lock file in
// it; a second start on it names the process that holds it).
package main

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runner"
)

// program is local mode's command line: it logs for a person at a terminal.
var program = function.Program{Name: "local", Synopsis: "--gitea-url URL [--registration-token-file FILE] [flags] | status [--state-dir DIR] [-o table|json]", TextLog: true}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "runner" {
		os.Exit(runner.Main(os.Args[:2], os.Args[2:]))
	}
	os.Exit(execute(context.Background(), os.Args[1:], os.Stderr))
}

// execute runs the command line args and returns the exit code; `local
// status` writes its report to os.Stdout.
func execute(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		return runStatus(args[1:], os.Stdout, stderr)
	}
	var cfg Config
	return program.Exec(ctx, &cfg, args, stderr, func(ctx context.Context, log *slog.Logger, _ []string) error {
		return run(ctx, cfg, log)
	})
}

// msgRunningLocal is the line that says local mode is up.
const msgRunningLocal = "gitea-dynamic-runner is running; Ctrl-C stops it"

func run(ctx context.Context, cfg Config, log *slog.Logger) error {
	l, err := start(ctx, cfg, log)
	if err != nil {
		return err
	}
	log.Info(msgRunningLocal, slog.String("gitea", cfg.GiteaURL),
		slog.Any("labels", cfg.labels()), slog.Int("capacity", cfg.Capacity), slog.String("state", cfg.StateDir))
	l.wait(ctx)
	log.Info("stopped")
	return nil
}
