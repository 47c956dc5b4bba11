package main

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// envPrefix prefixes every variable of every function.
const envPrefix = "GDR"

// Config is the configuration of dispatch, read from GDR_* variables.
type Config struct {
	natsconn.Config
	taskassignment.Naming
	gitea.Instance
	runnerpool.Source
	assignmentqueue.PayloadStore

	Stream            string        `envconfig:"STREAM" default:"CI_RUNNER" desc:"JetStream stream of assignments"`
	KeepAlive         time.Duration `envconfig:"KEEPALIVE" default:"1m" desc:"least time between two heartbeats of a claimed task that waits for its executor (Gitea fails it after ZOMBIE_TASK_TIMEOUT without one)"`
	WebhookSecret     string        `envconfig:"WEBHOOK_SECRET" desc:"secret of the Gitea workflow_job webhook; empty accepts unsigned deliveries"`
	HTTPAddr          string        `envconfig:"HTTP_ADDR" default:":8080" desc:"listen address of the HTTP server (handle: http mode only)"`
	Interval          time.Duration `envconfig:"INTERVAL" default:"0s" desc:"serve: also dispatch every pool this often (0: only on webhooks and ticks)"`
	RegistrationToken string        `envconfig:"REGISTRATION_TOKEN" desc:"register: Gitea runner registration token"`
	RunnerName        string        `envconfig:"RUNNER_NAME" default:"gitea-dynamic-runner" desc:"register: runner name prefix; a pool registers as <name>-<pool>"`
	LogLevel          slog.Level    `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
}

// loadConfig reads and checks the configuration and the pools file. Its
// errors name the variable or pool at fault and never echo a secret.
func loadConfig() (Config, runnerpool.Pools, error) {
	var c Config
	if err := envdoc.Process(envPrefix, &c); err != nil {
		return Config{}, nil, err
	}
	var errs []error
	if _, _, err := c.Parse(); err != nil {
		errs = append(errs, err)
	}
	if err := c.PayloadStore.Check(); err != nil {
		errs = append(errs, err)
	}
	if c.KeepAlive <= 0 {
		errs = append(errs, fmt.Errorf("GDR_KEEPALIVE %v: want a positive duration", c.KeepAlive))
	}
	pools, err := c.Source.Load()
	if err != nil {
		errs = append(errs, err)
	}
	return c, pools, errors.Join(errs...)
}

// payloadTTL is how long a payload is kept: the longest job timeout of any
// pool, and an hour for recover to see the task end.
func payloadTTL(pools runnerpool.Pools) time.Duration {
	var ttl time.Duration
	for _, p := range pools {
		ttl = max(ttl, p.Timeout())
	}
	return ttl + time.Hour
}
