package main

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backends"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// envPrefix prefixes every variable of every function.
const envPrefix = "GDR"

// Config is the configuration of handle, read from GDR_* variables.
type Config struct {
	natsconn.Config
	taskassignment.Naming
	runnerpool.Source
	bootstrap.Settings
	backends.Setup

	Mode       string        `envconfig:"MODE" default:"job" desc:"job: settle up to GDR_BATCH messages and exit (KEDA ScaledJob); http: serve CloudEvents (Knative); setup: create the stream and consumer, then exit"`
	Backend    string        `envconfig:"BACKEND" required:"true" desc:"backend this handler serves: pod, opensandbox or process"`
	Stream     string        `envconfig:"STREAM" default:"CI_RUNNER" desc:"JetStream stream of assignments"`
	Capacity   int           `envconfig:"CAPACITY" default:"10" desc:"most assignments of the backend delivered and not yet settled (the consumer's MaxAckPending)"`
	Batch      int           `envconfig:"BATCH" default:"1" desc:"job mode: most messages one run takes"`
	FetchWait  time.Duration `envconfig:"FETCH_WAIT" default:"2s" desc:"job mode: how long a run waits for its first message"`
	NakDelay   time.Duration `envconfig:"NAK_DELAY" default:"5s" desc:"when an assignment whose identity target is pending comes back"`
	ErrorDelay time.Duration `envconfig:"ERROR_DELAY" default:"15s" desc:"when an assignment that failed comes back"`
	HTTPAddr   string        `envconfig:"HTTP_ADDR" default:":8080" desc:"listen address of the HTTP server (handle: http mode only)"`
	LogLevel   slog.Level    `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
}

const (
	modeJob   = "job"
	modeHTTP  = "http"
	modeSetup = "setup"
)

// loadConfig reads and checks the configuration. Its errors name the
// variable at fault and never echo a secret.
func loadConfig() (Config, error) {
	var c Config
	if err := envdoc.Process(envPrefix, &c); err != nil {
		return Config{}, err
	}
	var errs []error
	if c.Mode != modeJob && c.Mode != modeHTTP && c.Mode != modeSetup {
		errs = append(errs, fmt.Errorf("GDR_MODE %q: want job, http or setup", c.Mode))
	}
	if _, err := taskassignment.ParseBackend(c.Backend); err != nil {
		errs = append(errs, fmt.Errorf("GDR_BACKEND: %w", err))
	}
	if _, _, err := c.Parse(); err != nil {
		errs = append(errs, err)
	}
	if c.Capacity < 1 {
		errs = append(errs, fmt.Errorf("GDR_CAPACITY %d: want at least 1", c.Capacity))
	}
	if c.Batch < 1 {
		errs = append(errs, fmt.Errorf("GDR_BATCH %d: want at least 1", c.Batch))
	}
	if c.Mode != modeSetup {
		if _, err := c.Settings.New(); err != nil {
			errs = append(errs, err)
		}
		if _, err := c.Source.Load(); err != nil {
			errs = append(errs, err)
		}
	}
	return c, errors.Join(errs...)
}
