// Command recover finishes, reports and cleans up whatever the backends hold
// (see package recoverer): one pass, then exit. Run it as a CronJob, from a
// Knative PingSource (GDR_RECOVER_MODE=http: every POST runs a pass), or by
// hand. GDR_RECOVER_MODE=finish is the fast path: one run takes a batch of
// finish notices (sent by the gateway when a runner's final result reached
// Gitea), finishes each executor at once and exits (a KEDA ScaledJob); the
// periodic pass stays the safety net.
//
// `recover status [-o table|json]` reports what `dispatch status` does (per
// pool: capacity, tasks in flight, started, waiting, the oldest wait, queued
// messages) and, per task, its Gitea run URL, its executor and phase, and
// why it waits: recover's NATS user may read the payloads and recover has
// the backend. It reads only.
//
// Exit status: 0 when the pass ran (single assignments that failed are
// logged and retried by the next pass), 1 when it could not run at all, 2 for
// bad configuration.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentevents"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/linked"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/health"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics/recovermetrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/push"
)

// program is recover's command line.
var program = function.Program{Name: "recover", Synopsis: "| status [-o table|json]"}

// Config is the configuration of recover, read from GDR_* variables.
type Config struct {
	function.CommonSettings
	function.HTTPSettings
	function.TickSettings
	natsconn.ConnSettings
	taskassignment.NamingSettings
	gitea.InstanceSettings
	runnerpool.PoolSettings
	assignmentqueue.PayloadSettings
	assignmentsig.SigningSettings
	bootstrap.Settings
	backend.BuildSettings
	assignmentevents.PublishSettings
	// Once mode pushes its pass's figures there as it exits.
	metrics.PushSettings

	Stream      string `envconfig:"GDR_STREAM" default:"CI_RUNNER" desc:"JetStream stream of assignments"`
	Mode        string `envconfig:"GDR_RECOVER_MODE" default:"once" desc:"recover: once (one pass, then exit: CronJob, manual Job), http (a pass per POST: Knative PingSource) or finish (one batch of finish notices, then exit: KEDA ScaledJob)"`
	Concurrency int    `envconfig:"GDR_RECOVER_CONCURRENCY" default:"8" desc:"recover: assignments handled at once"`
	// OrphanGrace is the Knative path's orphan rule (recoverer.Recoverer).
	OrphanGrace time.Duration `envconfig:"GDR_ORPHAN_GRACE" default:"30m" desc:"cloudevents (Knative): a payload without an executor is re-sent once its assignment was last sent this long ago (a send lost between dispatch and the channel); a repeat of a message the channel still offers is harmless"`

	// Finish mode.
	Batch     int           `envconfig:"GDR_RECOVER_BATCH" default:"8" desc:"recover finish mode: most finish notices one run takes from each backend's consumer"`
	FetchWait time.Duration `envconfig:"GDR_RECOVER_FETCH_WAIT" default:"2s" desc:"recover finish mode: how long a run waits for notices"`
	Retry     time.Duration `envconfig:"GDR_RECOVER_RETRY" default:"2s" desc:"recover finish mode: when a notice whose executor has not ended yet comes back (5 deliveries at most, then the periodic pass)"`

	pools runnerpool.Pools
}

// Check checks what envconfig cannot, and loads the pools file.
func (c *Config) Check() error { return c.check(linked.Backends()) }

// check is Check for a recover that links the backends backends.
func (c *Config) check(backends backend.Registry) error {
	var mode error
	switch {
	case c.Mode != "once" && c.Mode != "http" && c.Mode != modeFinish:
		mode = fmt.Errorf("GDR_RECOVER_MODE %q: want once, http or finish", c.Mode)
	case c.Mode == "http" && c.TickToken == "":
		mode = errors.New("GDR_TICK_TOKEN is required in http mode: every pass must be asked for by a known caller")
	case c.Mode == modeFinish && (c.Batch < 1 || c.FetchWait <= 0 || c.Retry <= 0):
		mode = errors.New("GDR_RECOVER_BATCH must be at least 1, GDR_RECOVER_FETCH_WAIT and GDR_RECOVER_RETRY above 0")
	case c.Mode == modeFinish && c.Publish == assignmentevents.PublishCloudEvents:
		mode = errors.New("GDR_RECOVER_MODE=finish reads the finish notices of the KEDA path: not with GDR_PUBLISH=cloudevents")
	case c.OrphanGrace <= 0:
		mode = fmt.Errorf("GDR_ORPHAN_GRACE %v: want a positive duration", c.OrphanGrace)
	}
	td, _, _ := c.Parse()
	pools, err := c.PoolSettings.Load()
	c.pools = pools
	errs := []error{c.NamingSettings.Check(), c.Settings.Check(td), c.PayloadSettings.Check(), c.SigningSettings.Check(),
		c.PublishSettings.Check(os.Getenv("K_SINK")), c.PushSettings.Check(), mode, err}
	// Every backend the pools name must be linked (build tags, as
	// handle's: package backend/linked) and its settings complete.
	checked := map[taskassignment.BackendKind]bool{}
	for _, p := range pools {
		switch {
		case checked[p.Backend]:
		case !slices.Contains(backends.Kinds(), p.Backend):
			errs = append(errs, fmt.Errorf("GDR_POOLS_FILE: pool %s: backend %s: this binary was built without that backend; it has %v", p.Name, p.Backend, backends.Kinds()))
		default:
			errs = append(errs, backends.Check(p.Backend, c.BuildSettings))
		}
		checked[p.Backend] = true
	}
	return errors.Join(errs...)
}

func main() {
	os.Exit(execute(context.Background(), os.Args[1:], os.Stderr))
}

// execute runs the command line args and returns the exit code; `recover
// status` writes its report to os.Stdout.
func execute(ctx context.Context, args []string, stderr io.Writer) int {
	return executeTo(ctx, args, os.Stdout, stderr)
}

// executeTo is execute with the report's writer given.
func executeTo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		return executeStatus(ctx, args[1:], stdout, stderr)
	}
	var cfg Config
	return program.Exec(ctx, &cfg, args, stderr, func(ctx context.Context, log *slog.Logger, _ []string) error {
		return run(ctx, cfg, log)
	})
}

func run(ctx context.Context, cfg Config, log *slog.Logger) error {
	r, js, closeFn, err := build(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("recover could not start: %w", err)
	}
	defer closeFn() // closing NATS flushes the notices' acks and naks
	switch cfg.Mode {
	case "http":
		reg := metrics.NewRegistry()
		listers := map[taskassignment.BackendKind]metrics.ExecutorLister{}
		for b, backend := range r.Backends {
			listers[b] = backend
		}
		reg.MustRegister(metrics.NewExecutors(listers, log))
		probes := health.Probes{Checks: []health.Check{{Name: "nats", Ready: natsconn.Connected(js.Conn())}}, Log: log}
		// A dead letter's assignment was signed by dispatch or by recover,
		// with the one key they share (GDR_ASSIGNMENT_SIGNING_KEY).
		signer, err := cfg.Signer()
		if err != nil {
			return err
		}
		dead := push.DeadLetters{Failer: r, Keys: signer, TrustDomain: r.TrustDomain, Log: log}
		return serve(ctx, cfg.HTTPAddr, cfg.TickSettings, r, dead, probes, reg, recovermetrics.NewRecover(reg), log)
	case modeFinish:
		return finish(ctx, cfg, r, js, log)
	}
	return passOnce(ctx, cfg, r, log)
}

// pushJob is the Pushgateway job label of recover's once-mode passes.
const pushJob = "gdr-recover"

// passOnce is once mode's one pass (the CronJob recover, a manual Job): it
// runs and logs the pass and, with GDR_METRICS_PUSH_URL, pushes what it
// counted (recovermetrics.Recover) to the Pushgateway as it ends.
func passOnce(ctx context.Context, cfg Config, r *recoverer.Recoverer, log *slog.Logger) error {
	reg := prometheus.NewRegistry() // the pass's own figures: no runtime collectors to push
	obs := recovermetrics.NewRecover(reg)
	defer cfg.PushAtExit(ctx, pushJob, reg, log)
	return pass(ctx, r, obs, log)
}

// passObserver hears of every pass (recovermetrics.Recover).
type passObserver interface {
	Pass(sum recoverer.Summary, err error)
}

// pass runs once and logs one summary line; obs, when not nil, hears of it.
func pass(ctx context.Context, r *recoverer.Recoverer, obs passObserver, log *slog.Logger) error {
	sum, err := r.Run(ctx)
	if obs != nil {
		obs.Pass(sum, err)
	}
	if err != nil {
		log.Error("recover pass incomplete", append(sum.Attrs(), slog.Any("error", err))...)
		return err
	}
	log.Info("recover pass", sum.Attrs()...)
	return nil
}

func build(ctx context.Context, cfg Config, log *slog.Logger) (_ *recoverer.Recoverer, _ jetstream.JetStream, _ func(), err error) {
	td, keys, err := cfg.Parse()
	if err != nil {
		return nil, nil, nil, err
	}
	boot, err := cfg.Settings.New(td)
	if err != nil {
		return nil, nil, nil, err
	}
	signer, err := cfg.Signer()
	if err != nil {
		return nil, nil, nil, err
	}
	// No message it publishes again opens after its payload is gone.
	signer = signer.WithTTL(cfg.pools.PayloadTTL())
	clients, err := gitea.PoolClients(cfg.GiteaURL, &http.Client{Timeout: 30 * time.Second}, cfg.pools)
	if err != nil {
		return nil, nil, nil, err
	}
	var closers []func() error
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}
	defer func() { // on any error below, nothing stays open
		if err != nil {
			closeAll()
		}
	}()
	rp := map[string]recoverer.Pool{}
	bs := map[taskassignment.BackendKind]executor.Backend{}
	for _, p := range cfg.pools {
		rp[p.Name] = recoverer.Pool{Pool: p, Tasks: gitea.TaskState{Client: clients[p.Name]}}
		if _, ok := bs[p.Backend]; ok {
			continue
		}
		b, closeBackend, err := linked.Backends().New(p.Backend, cfg.BuildSettings, backend.Deps{Keys: keys, TrustDomain: td, Pools: cfg.pools, Log: log})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		closers = append(closers, closeBackend)
		bs[p.Backend] = b
	}
	nc, js, err := natsconn.Connect(ctx, cfg.ConnSettings, "recover")
	if err != nil {
		return nil, nil, nil, err
	}
	closers = append(closers, func() error { return natsconn.Close(nc) })
	payloads, err := assignmentqueue.OpenPayloads(ctx, js, cfg.PayloadBucket, cfg.PayloadKey, cfg.PayloadOldKeys...)
	if err != nil {
		return nil, nil, nil, err
	}
	endings, err := assignmentqueue.OpenEndings(ctx, js, assignmentqueue.EndingsBucket(cfg.PayloadBucket))
	if err != nil {
		return nil, nil, nil, err
	}
	q := assignmentqueue.New(js, cfg.Stream).SignedBy(signer)
	r := &recoverer.Recoverer{
		TrustDomain: td, Keys: keys, Bootstrap: boot, Backends: bs, Pools: rp,
		Queue: q, Sender: q, Rejections: q, Payloads: payloads, Endings: endings, Concurrency: cfg.Concurrency, Log: log,
	}
	if cfg.CloudEvents() {
		// The Knative path: the channel's stream cannot be asked per
		// assignment, and its terminations carry no reason; orphans go by
		// the time they were last sent, and the channel's dead letters and
		// handle's rejection replies arrive at POST /dead-letter.
		sender, err := assignmentevents.NewSender(cfg.EventSink, "/gitea-dynamic-runner/recover", signer)
		if err != nil {
			return nil, nil, nil, err
		}
		r.Queue, r.Rejections, r.Sender = nil, nil, sender
		r.SendMarks, r.OrphanGrace = payloads, cfg.OrphanGrace
	}
	return r, js, closeAll, nil
}

// serve runs a pass per POST (a PingSource tick) until ctx ends.
func serve(ctx context.Context, addr string, ticks function.TickSettings, r *recoverer.Recoverer, dead push.DeadLetters, probes health.Probes, g prometheus.Gatherer, obs passObserver, log *slog.Logger) error {
	h, err := handler(ctx, ticks, r, dead, probes, g, obs, log)
	if err != nil {
		return err
	}
	log.Info("serving ticks and dead letters", slog.String("addr", addr))
	return function.ListenAndServe(ctx, function.Server(h, tickMaxBytes), addr)
}

// handler runs a pass per authorized POST / (a PingSource tick), hands each
// CloudEvent at POST /dead-letter to dead (the Knative path's dead letters
// and handle's rejection replies: each must carry an authentic assignment),
// answers probes at GET /healthz (NATS connected) and GET /livez, and g's
// metrics at GET /metrics.
func handler(ctx context.Context, ticks function.TickSettings, r *recoverer.Recoverer, dead push.DeadLetters, probes health.Probes, g prometheus.Gatherer, obs passObserver, log *slog.Logger) (http.Handler, error) {
	events, err := dead.NewHTTPHandler(ctx)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /dead-letter", events)
	mux.Handle("POST /{$}", ticks.Authorized(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if err := pass(req.Context(), r, obs, log); err != nil {
			http.Error(w, "recover pass incomplete; see the log", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})))
	probes.Register(mux)
	metrics.Register(mux, g)
	return mux, nil
}

// tickMaxBytes caps a request's body: a PingSource tick is small (its body
// is never read), and so is a dead letter (a signed assignment of a few
// KiB).
const tickMaxBytes = 64 << 10
