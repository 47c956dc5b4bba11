package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"
)

// PushTimeout bounds one push to the Pushgateway, its connection included:
// a run that exits waits no longer than this for its metrics to leave.
const PushTimeout = 10 * time.Second

// PushSettings is embedded in the configuration of the runs that exit
// (handle's job mode, recover's once mode): no Prometheus scrapes them, so
// each pushes what it counted to a Pushgateway as it ends.
type PushSettings struct {
	PushURL string `envconfig:"GDR_METRICS_PUSH_URL" desc:"a Pushgateway's base URL (http://pushgateway.monitoring.svc:9091): handle's job mode and recover's once mode push what they counted there as they exit (PUT, grouping key job gdr-handle or gdr-recover and instance = the Pod's name); empty: no push. No credentials or query in it"`
}

// Check refuses a push URL that is not a plain http(s) base URL. Its error
// never echoes the value.
func (s PushSettings) Check() error {
	if s.PushURL == "" {
		return nil
	}
	u, err := url.Parse(s.PushURL)
	switch {
	case err != nil, u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.Opaque != "":
		return errors.New("GDR_METRICS_PUSH_URL: want a Pushgateway's base URL, http(s)://host[:port][/path]")
	case u.User != nil:
		return errors.New("GDR_METRICS_PUSH_URL: no credentials in the URL (it is logged and kept in a ConfigMap)")
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return errors.New("GDR_METRICS_PUSH_URL: no query or fragment: the Pushgateway's path is appended to it")
	}
	return nil
}

// Enabled reports whether a push URL is set.
func (s PushSettings) Enabled() bool { return s.PushURL != "" }

// Push sends g's metrics to the Pushgateway under the grouping key job and
// instance (PUT: they replace what that group held), within PushTimeout
// even when ctx is done: a run pushes as it exits, SIGTERM included. The
// grouping key is what keeps concurrent runs apart (instance: the Pod's
// name, one group per run), and what Prometheus labels the pushed series
// with when it scrapes the Pushgateway with honor_labels. With no push URL
// it does nothing.
func (s PushSettings) Push(ctx context.Context, job, instance string, g prometheus.Gatherer) error {
	if !s.Enabled() {
		return nil
	}
	if err := s.Check(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), PushTimeout)
	defer cancel()
	return push.New(s.PushURL, job).Grouping("instance", instance).Gatherer(g).
		Client(&http.Client{Timeout: PushTimeout}).PushContext(ctx)
}

// PushAtExit is Push for a run that ends: instance is the host's name (in
// Kubernetes the Pod's), and the result is logged, never returned: a
// Pushgateway that is down costs the run's figures, not its exit status.
func (s PushSettings) PushAtExit(ctx context.Context, job string, g prometheus.Gatherer, log *slog.Logger) {
	if !s.Enabled() {
		return
	}
	instance, err := os.Hostname()
	if err != nil || instance == "" {
		log.Warn("metrics not pushed: no host name for the instance label", slog.Any("error", err))
		return
	}
	if err := s.Push(ctx, job, instance, g); err != nil {
		log.Warn("metrics not pushed", slog.String("job", job), slog.String("instance", instance), slog.Any("error", err))
		return
	}
	log.Debug("metrics pushed", slog.String("job", job), slog.String("instance", instance))
}
