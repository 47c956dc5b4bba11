package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/linked"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// program is handle's command line.
var program = function.Program{Name: "handle"}

// Config is the configuration of handle, read from GDR_* variables.
type Config struct {
	function.CommonSettings
	function.HTTPSettings
	natsconn.ConnSettings
	taskassignment.NamingSettings
	runnerpool.PoolSettings
	bootstrap.Settings
	assignmentsig.VerifySettings
	backend.BuildSettings
	// The payload bucket's name, for the end marks a redelivered message is
	// checked against (job mode); handle never holds the payload key.
	assignmentqueue.PayloadBucketSettings
	// Setup mode creates the streams with these replicas.
	assignmentqueue.ReplicaSettings
	// Job mode pushes its outcomes there as it exits.
	metrics.PushSettings

	Mode        string        `envconfig:"GDR_MODE" default:"job" desc:"job: settle up to GDR_BATCH messages (and, with GDR_LINGER, those that follow) and exit (KEDA ScaledJob); http: serve CloudEvents (Knative); setup: create the stream and consumer, then exit"`
	Backend     string        `envconfig:"GDR_BACKEND" required:"true" desc:"backend this handler serves: pod, opensandbox or process"`
	Stream      string        `envconfig:"GDR_STREAM" default:"CI_RUNNER" desc:"JetStream stream of assignments"`
	MaxInFlight int           `envconfig:"GDR_MAX_IN_FLIGHT" default:"10" desc:"most assignments of the backend delivered and not yet acknowledged, across every handle of it (the consumer's MaxAckPending; a pool's capacity is its own, in the pools file)"`
	Batch       int           `envconfig:"GDR_BATCH" default:"1" desc:"job mode: most messages one run takes"`
	FetchWait   time.Duration `envconfig:"GDR_FETCH_WAIT" default:"2s" desc:"job mode: how long a run waits for its first message"`
	NakDelay    time.Duration `envconfig:"GDR_NAK_DELAY" default:"5s" desc:"when an assignment whose identity target is pending comes back, and the longest a held one waits between offers (they start at 250 ms)"`
	ErrorDelay  time.Duration `envconfig:"GDR_ERROR_DELAY" default:"15s" desc:"when an assignment that failed first comes back; doubled with every delivery, at most 5m"`
	HoldFor     time.Duration `envconfig:"GDR_HOLD_FOR" default:"2m" desc:"job mode: how long a run keeps an assignment whose identity target is pending, offering it again (250 ms, growing to GDR_NAK_DELAY), before it hands it back"`
	Linger      time.Duration `envconfig:"GDR_LINGER" default:"0s" desc:"job mode: a warm handle: once its messages are settled, a run fetches again, waiting up to this long for the next, and ends at the first wait that brings none (0: one batch, then exit)"`
	LingerMax   time.Duration `envconfig:"GDR_LINGER_MAX" default:"5m" desc:"job mode: no lingering run fetches past this long after it began; the ScaledJob's activeDeadlineSeconds must exceed GDR_LINGER_MAX + GDR_HOLD_FOR"`

	pools runnerpool.Pools
}

const (
	modeJob   = "job"
	modeHTTP  = "http"
	modeSetup = "setup"
)

// Check checks what envconfig cannot, and loads the pools file. Its errors
// name the variable at fault and never echo a secret.
func (c *Config) Check() error { return c.check(linked.Backends()) }

// check is Check for a handle that links the backends backends.
func (c *Config) check(backends backend.Registry) error {
	var errs []error
	if c.Mode != modeJob && c.Mode != modeHTTP && c.Mode != modeSetup {
		errs = append(errs, fmt.Errorf("GDR_MODE %q: want job, http or setup", c.Mode))
	}
	_, backendErr := taskassignment.ParseBackendKind(c.Backend)
	if backendErr != nil {
		errs = append(errs, fmt.Errorf("GDR_BACKEND: %w", backendErr))
	}
	errs = append(errs, c.NamingSettings.Check(), c.ReplicaSettings.Check(), c.PushSettings.Check())
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("GDR_MAX_IN_FLIGHT %d: want at least 1", c.MaxInFlight))
	}
	if c.Batch < 1 {
		errs = append(errs, fmt.Errorf("GDR_BATCH %d: want at least 1", c.Batch))
	}
	// Each must be positive: a delay that is not redelivers a failing
	// assignment at once, burning its deliveries in seconds, and a hold that
	// is not would mean none (or, at zero, any of them would quietly mean
	// handler's default): a mistake to report, not guess.
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"GDR_FETCH_WAIT", c.FetchWait}, {"GDR_NAK_DELAY", c.NakDelay}, {"GDR_ERROR_DELAY", c.ErrorDelay}, {"GDR_HOLD_FOR", c.HoldFor}, {"GDR_LINGER_MAX", c.LingerMax}} {
		if d.value <= 0 {
			errs = append(errs, fmt.Errorf("%s %v: want a positive duration", d.name, d.value))
		}
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("GDR_LINGER %v: want 0 (no lingering) or a positive duration", c.Linger))
	}
	if c.Mode != modeSetup {
		_, keysErr := c.Keyring()
		td, _, _ := c.Parse()
		pools, err := c.PoolSettings.Load()
		c.pools = pools
		errs = append(errs, keysErr, c.Settings.Check(td), err)
		if backendErr == nil { // setup mode builds no backend: any may be set up
			errs = append(errs, backends.Check(taskassignment.BackendKind(c.Backend), c.BuildSettings))
		}
	}
	return errors.Join(errs...)
}
