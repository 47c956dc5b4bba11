package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// executeStatus is `recover status [-o table|json]` with recover's
// configuration: exit 0 with the report (also when nothing runs), 2 for bad
// usage or configuration, 1 when NATS or a backend cannot be read.
func executeStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("recover status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	format := function.OutputFlag(fs)
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		return function.ExitOK
	case err != nil:
		return function.ExitConfig
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "recover status: takes -o table|json only\n")
		fs.Usage()
		return function.ExitConfig
	}
	var cfg Config
	return program.Exec(ctx, &cfg, nil, stderr, func(ctx context.Context, log *slog.Logger, _ []string) error {
		return status(ctx, cfg, *format, stdout, log)
	})
}

// status writes the pools' status to w, with each task's run URL (its
// payload), executor, phase and the reason it waits (its backend). It
// changes nothing: it opens the payload store and the backends as a pass
// does, and only reads them.
func status(ctx context.Context, cfg Config, format string, w io.Writer, log *slog.Logger) error {
	r, js, closeFn, err := build(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("recover status: %w", err)
	}
	defer closeFn()
	payloads, ok := r.Payloads.(statusPayloads)
	if !ok {
		return errors.New("recover status: the payload store cannot be read for a report")
	}
	executors := map[taskassignment.BackendKind]poolstatus.Executors{}
	for b, backend := range r.Backends {
		executors[b] = backend
	}
	report, err := poolstatus.Read(ctx, poolstatus.Source{Payloads: payloads, Tasks: payloads, Executors: executors,
		Consumers: metrics.JetStreamConsumerInfo(js).Backlogs(), Stream: cfg.Stream}, cfg.pools, time.Now())
	if err != nil {
		return fmt.Errorf("recover status: %w", err)
	}
	return report.Write(w, format)
}

// statusPayloads is what a report reads of the payload store that build
// opens (assignmentqueue.Payloads).
type statusPayloads interface {
	poolstatus.Payloads
	poolstatus.Tasks
}
