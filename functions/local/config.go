package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/actionscache"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// Config is local mode's configuration: GDR_* variables, each
// overridden by its flag.
type Config struct {
	function.CommonSettings
	actionscache.Settings

	GiteaURL          string        `envconfig:"GDR_GITEA_URL" desc:"local: Gitea's root URL (flag --gitea-url)"`
	RegistrationToken string        `envconfig:"GDR_REGISTRATION_TOKEN" desc:"local: runner registration token, needed on the first start only (or flag --registration-token-file; never on a command line)"`
	Labels            string        `envconfig:"GDR_LABELS" default:"ubuntu-latest" desc:"local: comma-separated runner labels (flag --labels)"`
	StateDir          string        `envconfig:"GDR_STATE_DIR" default:"./.gdr" desc:"local: state directory: queue, keys, credentials, executors, actions cache (flag --state-dir)"`
	Capacity          int           `envconfig:"GDR_CAPACITY" default:"2" desc:"local: the capacity of its one pool: jobs run at once (flag --capacity)"`
	GatewayAddr       string        `envconfig:"GDR_GATEWAY_ADDR" default:"127.0.0.1:41443" desc:"local: the gateway's address; keep it stable, running executors reconnect to it after a restart (flag --gateway-addr)"`
	WebhookAddr       string        `envconfig:"GDR_WEBHOOK_ADDR" desc:"local: serve Gitea's workflow_job webhook at http://<addr>/webhook; empty: poll only (flag --webhook-addr)"`
	WebhookSecret     string        `envconfig:"GDR_WEBHOOK_SECRET" desc:"local: secret of the Gitea workflow_job webhook; empty: deliveries are not checked, which local mode allows only on a loopback --webhook-addr (127.0.0.0/8, ::1, localhost) or with GDR_ALLOW_UNSIGNED_WEBHOOKS"`
	WebhookOldSecrets string        `envconfig:"GDR_WEBHOOK_OLD_SECRETS" desc:"local: comma-separated earlier secrets of the webhook, each accepted besides GDR_WEBHOOK_SECRET: a rotation, while Gitea may still sign with one; needs GDR_WEBHOOK_SECRET; a secret with a comma, or space at either end, cannot be listed"`
	AllowUnsigned     bool          `envconfig:"GDR_ALLOW_UNSIGNED_WEBHOOKS" default:"false" desc:"local: accept webhook deliveries without a signature on a --webhook-addr that is not loopback when GDR_WEBHOOK_SECRET is empty"`
	PollInterval      time.Duration `envconfig:"GDR_POLL_INTERVAL" default:"500ms" desc:"local: how often Gitea is asked for jobs (one FetchTask), besides the rounds a webhook or a freed slot asks for"`
	BusyPollInterval  time.Duration `envconfig:"GDR_BUSY_POLL_INTERVAL" default:"200ms" desc:"local: how often Gitea is asked while busy: for GDR_BUSY_WINDOW after a job was claimed or ended, or a webhook came (not below GDR_POLL_INTERVAL: never busy)"`
	BusyWindow        time.Duration `envconfig:"GDR_BUSY_WINDOW" default:"30s" desc:"local: how long the pool stays busy after its last sign of work"`
	MetricsAddr       string        `envconfig:"GDR_METRICS_ADDR" desc:"local: serve /metrics, /healthz and /livez at http://<addr>/ (plain HTTP: keep it on 127.0.0.1); empty: none (flag --metrics-addr)"`
	RecoverInterval   time.Duration `envconfig:"GDR_RECOVER_INTERVAL" default:"30s" desc:"local: how often recover's safety-net pass runs (an executor is finished as soon as its process ends; the pass catches those started before a restart)"`
	LogFormatName     string        `envconfig:"GDR_LOG_FORMAT" default:"text" desc:"local: text (for a person) or json (one JSON object a line, for machines) (flag --log-format)"`

	// tokenFile is --registration-token-file: a token is never given on the
	// command line, where every user's ps shows it.
	tokenFile string
}

// Flags defines the flags that override the environment.
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.GiteaURL, "gitea-url", c.GiteaURL, "Gitea's root URL")
	fs.StringVar(&c.tokenFile, "registration-token-file", "", "file holding the runner registration token (first start only); or GDR_REGISTRATION_TOKEN")
	fs.StringVar(&c.Labels, "labels", c.Labels, "comma-separated runner labels")
	fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "state directory")
	fs.IntVar(&c.Capacity, "capacity", c.Capacity, "jobs run at once")
	fs.StringVar(&c.GatewayAddr, "gateway-addr", c.GatewayAddr, "the gateway's address")
	fs.StringVar(&c.WebhookAddr, "webhook-addr", c.WebhookAddr, "serve the workflow_job webhook here")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "serve /metrics, /healthz and /livez here")
	fs.StringVar(&c.LogFormatName, "log-format", c.LogFormatName, "log format: text or json")
}

// Check checks the configuration once flags are applied.
func (c *Config) Check() error {
	var errs []error
	if c.tokenFile != "" {
		data, err := os.ReadFile(c.tokenFile)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--registration-token-file: %w", err))
		case strings.TrimSpace(string(data)) == "":
			errs = append(errs, fmt.Errorf("--registration-token-file %s is empty", c.tokenFile))
		default:
			c.RegistrationToken = strings.TrimSpace(string(data))
		}
	}
	if c.GiteaURL == "" {
		errs = append(errs, errors.New("--gitea-url (GDR_GITEA_URL) is required"))
	} else if u, err := url.Parse(c.GiteaURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, errors.New("--gitea-url is not an http(s) URL")) // not quoted: a URL may carry user info
	} else if !strings.HasSuffix(c.GiteaURL, "/") {
		c.GiteaURL += "/"
	}
	if len(c.labels()) == 0 {
		errs = append(errs, errors.New("--labels is empty"))
	}
	if c.Capacity < 1 {
		errs = append(errs, fmt.Errorf("--capacity %d: want at least 1", c.Capacity))
	}
	if c.WebhookAddr != "" && c.WebhookSecret == "" && !c.AllowUnsigned && !isLoopback(c.WebhookAddr) {
		errs = append(errs, fmt.Errorf("--webhook-addr %s is not a loopback address and GDR_WEBHOOK_SECRET is not set: unsigned webhook deliveries from the network are refused (set GDR_WEBHOOK_SECRET and the webhook's secret in Gitea, listen on 127.0.0.1, or GDR_ALLOW_UNSIGNED_WEBHOOKS=true accepts them)", c.WebhookAddr))
	}
	if err := webhook.CheckOldSecrets(c.WebhookSecret, c.WebhookOldSecrets); err != nil {
		errs = append(errs, err)
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("--state-dir is empty"))
	}
	if c.LogFormatName != "text" && c.LogFormatName != "json" {
		errs = append(errs, fmt.Errorf("--log-format %q: want text or json", c.LogFormatName))
	}
	if c.PollInterval <= 0 || c.RecoverInterval <= 0 {
		errs = append(errs, errors.New("GDR_POLL_INTERVAL and GDR_RECOVER_INTERVAL must be positive"))
	}
	if c.BusyPollInterval < 0 || c.BusyWindow < 0 {
		errs = append(errs, fmt.Errorf("GDR_BUSY_POLL_INTERVAL %v, GDR_BUSY_WINDOW %v: neither may be negative", c.BusyPollInterval, c.BusyWindow))
	}
	if err := c.Settings.Check(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// isLoopback says whether the listen address addr (host:port) reaches this
// machine only: a loopback IP (127.0.0.0/8, ::1) or localhost. Every other
// host, an empty one (every interface) or a name that may resolve anywhere,
// is not.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// cacheDir is where the actions cache lives: GDR_CACHE_DIR, else the state
// directory's cache/.
func (c Config) cacheDir() string {
	if c.CacheDir != "" {
		return c.CacheDir
	}
	return filepath.Join(c.StateDir, "cache")
}

// LogFormat is the log format of every line local mode writes: "text" or
// "json" (function.LogFormatter).
func (c *Config) LogFormat() string { return c.LogFormatName }

func (c Config) labels() []string {
	var out []string
	for _, l := range strings.Split(c.Labels, ",") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
