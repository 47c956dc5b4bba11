// Command dispatch claims tasks from Gitea for the configured runner pools
// and queues one assignment per task; it also keeps claimed tasks that wait
// for an executor alive in Gitea.
//
//	dispatch keygen DIR        write the install's keys and secrets into DIR, each file 0600
//	                           (deploy/README.md, install step 1); needs no configuration
//	dispatch register          register every pool that has no credentials yet
//	dispatch run [-pool NAME]  one round for every pool (or one): a CronJob, a manual run
//	dispatch status [-o json]  per pool: capacity, tasks in flight, started, waiting
//	                           and the oldest wait, queued messages (read only)
//	dispatch serve             HTTP: Gitea's workflow_job webhook at /webhook, a schedule
//	                           tick (Knative PingSource, any POST) at /, readiness at /healthz
//	                           (NATS connected, Gitea reachable), liveness at /livez, metrics at /metrics
//
// Exit status: 0 when everything asked for was done, 1 when something could
// not be (the log says what), 2 for bad configuration or usage.
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentevents"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/health"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/installkeys"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics/dispatchmetrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

// program is dispatch's command line.
var program = function.Program{Name: "dispatch", Synopsis: "keygen DIR | register | run [-pool NAME] | serve [-pool NAME] | status [-o table|json] | check",
	Commands: []string{"register", "run", "serve", "status", "check"}}

func main() {
	os.Exit(execute(context.Background(), os.Args[1:], os.Stderr))
}

// execute runs dispatch's command line args and returns the exit code;
// status writes its report to os.Stdout.
func execute(ctx context.Context, args []string, stderr io.Writer) int {
	return executeTo(ctx, args, os.Stdout, stderr)
}

// executeTo is execute with the report's writer given.
func executeTo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "keygen" {
		return keygen(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "register" {
		var cfg RegisterConfig
		return program.Exec(ctx, &cfg, args, stderr, func(ctx context.Context, log *slog.Logger, args []string) error {
			if len(args) > 1 {
				return function.Usage(fmt.Errorf("register takes no arguments, got %q", args[1:]))
			}
			return register(ctx, cfg, &http.Client{Timeout: 30 * time.Second}, log)
		})
	}
	if len(args) > 0 && args[0] == "check" {
		var cfg CheckConfig
		return program.Exec(ctx, &cfg, args, stderr, func(ctx context.Context, _ *slog.Logger, args []string) error {
			if len(args) > 1 {
				return function.Usage(fmt.Errorf("check takes no arguments, got %q", args[1:]))
			}
			return check(ctx, cfg, &http.Client{Timeout: 30 * time.Second}, stdout)
		})
	}
	var cfg Config
	return program.Exec(ctx, &cfg, args, stderr, func(ctx context.Context, log *slog.Logger, args []string) error {
		return run(ctx, cfg, log, args, stdout)
	})
}

// keygen writes the install's keys into the folder args names (installkeys.Write) and prints
// the paths it wrote, never a key; it reads no configuration.
func keygen(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "dispatch: keygen takes the folder to write the keys into, got %q\nusage: dispatch keygen DIR\n", args)
		return function.ExitConfig
	}
	written, err := installkeys.Write(args[0], rand.Reader)
	if err != nil {
		fmt.Fprintf(stderr, "dispatch: keygen: %v\n", err)
		return function.ExitFailed
	}
	for _, p := range written {
		fmt.Fprintln(stdout, p)
	}
	return function.ExitOK
}

// run carries out the command in args.
func run(ctx context.Context, cfg Config, log *slog.Logger, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return function.Usage(errors.New("no command"))
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	pools := cfg.pools
	switch cmd := args[0]; cmd {
	case "status":
		fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		format := function.OutputFlag(fs)
		if err := fs.Parse(args[1:]); err != nil {
			return function.Usage(fmt.Errorf("%s: %w", cmd, err))
		}
		if fs.NArg() > 0 {
			return function.Usage(fmt.Errorf("status takes -o table or -o json only, got %q", args[1:]))
		}
		return status(ctx, cfg, pools, *format, stdout)
	case "run", "serve":
		fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		only := fs.String("pool", "", "dispatch only this pool")
		if err := fs.Parse(args[1:]); err != nil {
			return function.Usage(fmt.Errorf("%s: %w", cmd, err))
		}
		if fs.NArg() > 0 {
			return function.Usage(fmt.Errorf("%s takes no arguments, got %q", cmd, fs.Args()))
		}
		if *only != "" {
			p, err := pools.Get(*only)
			if err != nil {
				return function.Usage(fmt.Errorf("-pool: %w", err))
			}
			pools = runnerpool.Pools{p}
		}
		if cmd == "serve" && cfg.WebhookSecret == "" && !cfg.AllowUnsigned {
			return function.Usage(errors.New("serve: GDR_WEBHOOK_SECRET is not set, and unsigned webhook deliveries are refused (GDR_ALLOW_UNSIGNED_WEBHOOKS=true accepts them)"))
		}
		svc, closeFn, err := newService(ctx, cfg, pools, hc, log)
		if err != nil {
			return fmt.Errorf("dispatch could not start: %w", err)
		}
		defer closeFn()
		if cmd == "run" {
			return svc.dispatchAll(ctx, svc.pools)
		}
		return svc.serve(ctx, cfg.HTTPAddr)
	default:
		return function.Usage(fmt.Errorf("unknown command %q", cmd))
	}
}

// check asks Gitea and NATS for what dispatch needs of them, with its own settings and
// credentials, and writes one line per question: each pool's registration declares its labels
// (as every dispatch round does: Gitea reachable, the runner known, its token accepted), and
// dispatch's NATS user connects and, on the KEDA path, finds the assignments' stream (handle's
// setup Job makes it); with GDR_SPIRE_SERVER, the SPIRE Server answers as one of the trust
// domain (spireServer). It changes nothing Gitea or NATS would not see from a round, claims no
// task, and fails when any answer is not ok: `helm test` runs it.
func check(ctx context.Context, cfg CheckConfig, hc *http.Client, w io.Writer) error {
	pools := cfg.pools
	var errs []error
	report := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			fmt.Fprintf(w, "%s: %v\n", what, err)
			return
		}
		fmt.Fprintf(w, "%s: ok\n", what)
	}
	giteaURL, natsURL := redacted(cfg.GiteaURL), redacted(cfg.URL)
	clients, err := gitea.PoolClients(cfg.GiteaURL, hc, pools)
	if err != nil {
		report("gitea "+giteaURL, err)
	}
	for _, p := range pools {
		if c := clients[p.Name]; c != nil {
			report(fmt.Sprintf("gitea %s: pool %s", giteaURL, p.Name), c.Declare(ctx, p.Labels))
		}
	}
	if cfg.SPIREServer != "" && !strings.HasPrefix(cfg.SPIREServer, "unix:") {
		what := "spire " + cfg.SPIREServer
		id, err := spireServer(ctx, cfg.SPIREServer, cfg.TrustDomain)
		if err == nil {
			what += ": server " + id
		}
		report(what, err)
	}
	nc, js, err := natsconn.Connect(ctx, cfg.ConnSettings, "dispatch")
	report("nats "+natsURL+": user dispatch", err)
	if err == nil {
		defer func() { _ = natsconn.Close(nc) }()
		if !cfg.CloudEvents() {
			_, err := js.Stream(ctx, cfg.Stream)
			report(fmt.Sprintf("nats %s: stream %s", natsURL, cfg.Stream), err)
		}
	}
	return errors.Join(errs...)
}

// spireServer completes a TLS handshake with the SPIRE Server's TCP API at addr and returns the
// SPIFFE ID of the certificate it presents, which must be of the trust domain td: proof that the
// address reaches a SPIRE Server of this installation's trust domain. It proves no more (check's
// Pod holds no SVID and no bundle to verify the chain with, so the certificate is not
// authenticated) and sends nothing over the connection.
func spireServer(ctx context.Context, addr, td string) (string, error) {
	trust, err := spiffeid.TrustDomainFromString(td)
	if err != nil {
		return "", fmt.Errorf("GDR_TRUST_DOMAIN %q: %w", td, err)
	}
	var id spiffeid.ID
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // no bundle here: VerifyConnection checks the ID alone, and nothing is sent
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no certificate")
			}
			got, err := x509svid.IDFromCert(cs.PeerCertificates[0])
			if err != nil {
				return fmt.Errorf("not a SPIFFE SVID: %w", err)
			}
			if !got.MemberOf(trust) {
				return fmt.Errorf("its SVID %s is not of trust domain %s", got, trust)
			}
			id = got
			return nil
		},
	}}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	_ = conn.Close()
	return id.String(), nil
}

// redacted is a comma-separated list of URLs with any password in them replaced (url.URL's
// Redacted); a part that does not parse is left out.
func redacted(urls string) string {
	var out []string
	for _, part := range strings.Split(urls, ",") {
		if u, err := url.Parse(strings.TrimSpace(part)); err == nil {
			out = append(out, u.Redacted())
		}
	}
	return strings.Join(out, ",")
}

// register registers every pool that has no credentials yet. A pool that
// has them is left alone, so it is safe to run again.
func register(ctx context.Context, cfg RegisterConfig, hc *http.Client, log *slog.Logger) error {
	var errs []error
	for _, p := range cfg.pools {
		store := gitea.FileStore{Path: p.Credentials}
		_, err := store.Load()
		if err == nil {
			log.Info("pool already registered", slog.String("pool", p.Name))
			continue
		}
		if !errors.Is(err, gitea.ErrNoCredentials) {
			errs = append(errs, fmt.Errorf("pool %s: %w", p.Name, err))
			continue
		}
		if cfg.RegistrationToken == "" {
			errs = append(errs, fmt.Errorf("pool %s: GDR_REGISTRATION_TOKEN is not set", p.Name))
			continue
		}
		creds, err := gitea.Register(ctx, cfg.GiteaURL, hc, gitea.Registration{
			Token: cfg.RegistrationToken, Name: cfg.RunnerName + "-" + p.Name, Labels: p.Labels,
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", p.Name, err))
			continue
		}
		if err := store.Save(creds); err != nil {
			errs = append(errs, fmt.Errorf("pool %s: save credentials: %w", p.Name, err))
			continue
		}
		log.Info("pool registered", slog.String("pool", p.Name), slog.Int64("runner_id", creds.ID))
	}
	return errors.Join(errs...)
}

// newService connects to NATS and Gitea for the pools; its background rounds
// run on ctx. The returned function drains the NATS connection.
func newService(ctx context.Context, cfg Config, pools runnerpool.Pools, hc *http.Client, log *slog.Logger) (_ *service, _ func(), err error) {
	td, _, err := cfg.Parse()
	if err != nil {
		return nil, nil, err
	}
	clients, err := gitea.PoolClients(cfg.GiteaURL, hc, pools)
	if err != nil {
		return nil, nil, err
	}
	var dps []dispatcher.Pool
	for _, p := range pools {
		client := clients[p.Name]
		dps = append(dps, dispatcher.Pool{Pool: p, Registration: client, Tasks: gitea.TaskState{Client: client}})
		if p.Paused { // what an operator checks after pausing (docs/OPERATIONS.md, "Pausing")
			log.Info("pool paused: claiming nothing for it", slog.String("pool", p.Name))
		}
	}
	nc, js, err := natsconn.Connect(ctx, cfg.ConnSettings, "dispatch")
	if err != nil {
		return nil, nil, err
	}
	closeNATS := func() { _ = natsconn.Close(nc) }
	defer func() { // on any error below, nothing stays open
		if err != nil {
			closeNATS()
		}
	}()
	signer, err := cfg.Signer()
	if err != nil {
		return nil, nil, err
	}
	// No message opens after its payload is gone.
	signer = signer.WithTTL(cfg.pools.PayloadTTL())
	// The finish notices' stream is the gateway's on both paths.
	if err := assignmentqueue.NewFinished(js, cfg.Stream).Replicated(cfg.Replicas).Ensure(ctx); err != nil {
		return nil, nil, err
	}
	q := assignmentqueue.New(js, cfg.Stream).Replicated(cfg.Replicas).SignedBy(signer)
	var send dispatcher.Queue = q
	if cfg.CloudEvents() {
		// The Knative path: the channel keeps the messages in a stream of
		// its own; no queue stream, no rejection stream, no consumer lag.
		if send, err = assignmentevents.NewSender(cfg.EventSink, "/gitea-dynamic-runner/dispatch", signer); err != nil {
			return nil, nil, err
		}
	} else if err := errors.Join(q.EnsureStream(ctx), q.EnsureRejections(ctx)); err != nil {
		return nil, nil, err
	}
	// The bucket is every pool's: its TTL comes from the whole pools file,
	// also when this process serves one pool.
	bucket := assignmentqueue.Bucket{Name: cfg.PayloadBucket, TTL: cfg.pools.PayloadTTL(), Replicas: cfg.Replicas}
	payloads, err := assignmentqueue.EnsurePayloads(ctx, js, bucket, cfg.PayloadKey, cfg.PayloadOldKeys...)
	if err != nil {
		return nil, nil, err
	}
	// The end marks live as long as the payloads; handle and recover open
	// them.
	bucket.Name = assignmentqueue.EndingsBucket(cfg.PayloadBucket)
	if _, err := assignmentqueue.EnsureEndings(ctx, js, bucket); err != nil {
		return nil, nil, err
	}
	reg := metrics.NewRegistry()
	d := &dispatcher.Dispatcher{TrustDomain: td, Queue: send, Payloads: payloads, Log: log, KeepAlive: cfg.KeepAlive,
		Observer: dispatchmetrics.NewDispatch(reg)}
	if !cfg.CloudEvents() {
		reg.MustRegister(metrics.NewConsumers(metrics.JetStreamConsumerInfo(js), q.Stream(), consumersOf(pools), log))
	}
	var cadence *dispatcher.Cadence
	if cfg.Interval > 0 {
		cadence = &dispatcher.Cadence{Idle: cfg.Interval, Busy: cfg.BusyInterval, Window: cfg.BusyWindow}
	}
	secret, oldSecrets := cfg.webhookSecrets()
	svc := newHTTPService(ctx, d, dps, secret, oldSecrets, cfg.TickSettings, cadence, log)
	svc.probes = health.Probes{Checks: []health.Check{{Name: "nats", Ready: natsconn.Connected(nc)}, giteaCheck(readinessPool(dps))}, Log: log}
	svc.metrics = reg
	svc.receiver.Observer = dispatchmetrics.NewJobs(reg, pools)
	return svc, closeNATS, nil
}

// giteaReadyTTL is how long readiness trusts its last look at Gitea: a
// storm of probes costs Gitea one Declare per giteaReadyTTL.
const giteaReadyTTL = 10 * time.Second

// readinessPool is the pool readiness declares: the first not paused (a
// paused pool's labels are declared by nobody), else the first.
func readinessPool(dps []dispatcher.Pool) dispatcher.Pool {
	for _, p := range dps {
		if !p.Paused {
			return p
		}
	}
	return dps[0]
}

// giteaCheck is readiness's look at Gitea: p's registration declares its
// labels, as every dispatch round does (Gitea reachable, the registration
// accepted), at most once per giteaReadyTTL. One pool is enough: every pool
// speaks to the same Gitea.
func giteaCheck(p dispatcher.Pool) health.Check {
	return health.Check{Name: "gitea", Ready: health.Cached(giteaReadyTTL, func(ctx context.Context) error {
		return p.Registration.Declare(ctx, p.Labels)
	})}
}

// consumersOf names the durable consumers that feed pools' backends: one
// per backend, named after it (assignmentqueue.Queue.OpenConsumer).
func consumersOf(pools runnerpool.Pools) []string {
	var names []string
	seen := map[string]bool{}
	for _, p := range pools {
		if b := string(p.Backend); !seen[b] {
			seen[b] = true
			names = append(names, b)
		}
	}
	return names
}

// status writes the pools' status to w. It only reads: no stream, bucket or
// consumer is created, and no payload is opened (dispatch's NATS user may
// not read one back), so the report carries no run URLs: `recover status` has
// them, and executors.
func status(ctx context.Context, cfg Config, pools runnerpool.Pools, format string, w io.Writer) error {
	nc, js, err := natsconn.Connect(ctx, cfg.ConnSettings, "dispatch")
	if err != nil {
		return err
	}
	defer func() { _ = natsconn.Close(nc) }()
	var payloads poolstatus.Payloads
	switch p, err := assignmentqueue.OpenPayloads(ctx, js, cfg.PayloadBucket, cfg.PayloadKey, cfg.PayloadOldKeys...); {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		payloads = noPayloads{} // nothing was ever dispatched: nothing runs
	case err != nil:
		return err
	default:
		payloads = p
	}
	r, err := poolstatus.Read(ctx, poolstatus.Source{Payloads: payloads, Consumers: metrics.JetStreamConsumerInfo(js).Backlogs(),
		Stream: cfg.Stream}, pools, time.Now())
	if err != nil {
		return err
	}
	return r.Write(w, format)
}

// noPayloads is the payload store before dispatch first ran: empty.
type noPayloads struct{}

func (noPayloads) Stored(context.Context) (map[string]time.Time, error) { return nil, nil }
func (noPayloads) Started(context.Context, string) (bool, error)        { return false, nil }
