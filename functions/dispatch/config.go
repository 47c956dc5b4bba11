package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentevents"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// Config is the configuration of dispatch, read from GDR_* variables.
type Config struct {
	function.CommonSettings
	function.HTTPSettings
	function.TickSettings
	natsconn.ConnSettings
	taskassignment.NamingSettings
	gitea.InstanceSettings
	runnerpool.PoolSettings
	assignmentqueue.PayloadSettings
	assignmentqueue.ReplicaSettings
	assignmentsig.SigningSettings
	assignmentevents.PublishSettings

	Stream            string        `envconfig:"GDR_STREAM" default:"CI_RUNNER" desc:"JetStream stream of assignments"`
	KeepAlive         time.Duration `envconfig:"GDR_KEEPALIVE" default:"1m" desc:"least time between two heartbeats of a claimed task that waits for its executor (Gitea fails it after ZOMBIE_TASK_TIMEOUT without one)"`
	WebhookSecret     string        `envconfig:"GDR_WEBHOOK_SECRET" desc:"secret of the Gitea workflow_job webhook; empty: dispatch serve refuses to start unless GDR_ALLOW_UNSIGNED_WEBHOOKS (local mode: unless its webhook listens on loopback)"`
	WebhookOldSecrets string        `envconfig:"GDR_WEBHOOK_OLD_SECRETS" desc:"serve: comma-separated earlier secrets of the webhook, each accepted besides GDR_WEBHOOK_SECRET: a rotation, while Gitea may still sign with one (docs/OPERATIONS.md, \"Rotating secrets\"); needs GDR_WEBHOOK_SECRET; a secret with a comma, or space at either end, cannot be listed"`
	AllowUnsigned     bool          `envconfig:"GDR_ALLOW_UNSIGNED_WEBHOOKS" default:"false" desc:"serve: accept webhook deliveries without a signature when GDR_WEBHOOK_SECRET is empty"`
	Interval          time.Duration `envconfig:"GDR_POLL_INTERVAL" default:"500ms" desc:"serve: also dispatch every pool this often, besides webhooks and ticks (0: only on webhooks and ticks); an idle round is one FetchTask per pool"`
	BusyInterval      time.Duration `envconfig:"GDR_BUSY_POLL_INTERVAL" default:"200ms" desc:"serve: dispatch a busy pool this often instead: for GDR_BUSY_WINDOW after a round claimed or dropped a task, a task of the pool ended, or a webhook named one of its jobs (0, or not below GDR_POLL_INTERVAL: never busy)"`
	BusyWindow        time.Duration `envconfig:"GDR_BUSY_WINDOW" default:"30s" desc:"serve: how long a pool stays busy after its last sign of work"`
	RegisterSettings

	pools runnerpool.Pools
}

// RegisterSettings are what `dispatch register` adds to the pools and Gitea's address.
type RegisterSettings struct {
	RegistrationToken string `envconfig:"GDR_REGISTRATION_TOKEN" desc:"register: Gitea runner registration token"`
	RunnerName        string `envconfig:"GDR_RUNNER_NAME" default:"gitea-dynamic-runner" desc:"register: runner name prefix; a pool registers as <name>-<pool>"`
}

// RegisterConfig is the configuration of `dispatch register`: Gitea, the pools and the token,
// nothing else. It runs on the operator's machine once, before any key reaches the cluster, so
// it must not ask for the keys, NATS or SPIRE that serve and run need.
type RegisterConfig struct {
	function.CommonSettings
	gitea.InstanceSettings
	runnerpool.PoolSettings
	RegisterSettings

	pools runnerpool.Pools
}

// CheckConfig is what `dispatch check` reads: no key, no secret but the NATS user's and the
// runner registrations (helm test's Pod carries nothing more).
type CheckConfig struct {
	function.CommonSettings
	natsconn.ConnSettings
	gitea.InstanceSettings
	runnerpool.PoolSettings
	assignmentevents.PublishSettings

	Stream string `envconfig:"GDR_STREAM" default:"CI_RUNNER" desc:"JetStream stream of assignments"`
	// SPIREServer and TrustDomain: with identity spire, check reaches the SPIRE Server.
	SPIREServer string `envconfig:"GDR_SPIRE_SERVER" desc:"check: the SPIRE Server's TCP API (host:port), reached and its certificate's SPIFFE ID checked against GDR_TRUST_DOMAIN; empty (identity ca): not checked"`
	TrustDomain string `envconfig:"GDR_TRUST_DOMAIN" desc:"check, with GDR_SPIRE_SERVER: the trust domain the SPIRE Server's SVID must be of"`

	pools runnerpool.Pools
}

// Check loads the pools file.
func (c *CheckConfig) Check() error {
	pools, err := c.PoolSettings.Load()
	c.pools = pools
	return err
}

// Check loads the pools file.
func (c *RegisterConfig) Check() error {
	pools, err := c.PoolSettings.Load()
	c.pools = pools
	return err
}

// Check checks what envconfig cannot, and loads the pools file. Its errors
// name the variable or pool at fault and never echo a secret.
func (c *Config) Check() error {
	var keepAlive error
	if c.KeepAlive <= 0 {
		keepAlive = fmt.Errorf("GDR_KEEPALIVE %v: want a positive duration", c.KeepAlive)
	}
	var pace error
	if c.Interval < 0 || c.BusyInterval < 0 || c.BusyWindow < 0 {
		pace = fmt.Errorf("GDR_POLL_INTERVAL %v, GDR_BUSY_POLL_INTERVAL %v, GDR_BUSY_WINDOW %v: none may be negative", c.Interval, c.BusyInterval, c.BusyWindow)
	}
	pools, err := c.PoolSettings.Load()
	c.pools = pools
	var paused error
	if err == nil {
		paused = c.PoolSettings.CheckPaused(pools)
	}
	return errors.Join(c.NamingSettings.Check(), c.PayloadSettings.Check(), c.ReplicaSettings.Check(), c.SigningSettings.Check(), c.PublishSettings.Check(os.Getenv("K_SINK")),
		webhook.CheckOldSecrets(c.WebhookSecret, c.WebhookOldSecrets), keepAlive, pace, err, paused)
}

// webhookSecrets are the secret a webhook delivery is checked with (none when
// empty) and a rotation's old secrets, also accepted.
func (c *Config) webhookSecrets() (secret []byte, oldSecrets [][]byte) {
	return []byte(c.WebhookSecret), webhook.ParseSecrets(c.WebhookOldSecrets)
}
