// Command gateway lets executors report their own task to Gitea and nothing
// else (see package gateway). It serves the runner protocol over SPIFFE mTLS:
// its own X.509-SVID and the trust bundle come from the SPIFFE Workload API
// (SPIFFE_ENDPOINT_SOCKET), or from files (GDR_SVID_*).
//
// Exit status: 0 after a clean shutdown, 1 when it could not serve, 2 for bad
// configuration.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/actionscache"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gateway"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/health"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidfile"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// program is gateway's command line.
var program = function.Program{Name: "gateway"}

// Config is the configuration of gateway, read from GDR_* variables.
type Config struct {
	function.CommonSettings
	function.HTTPSettings
	natsconn.ConnSettings
	taskassignment.NamingSettings
	gitea.InstanceSettings
	runnerpool.PoolSettings
	assignmentqueue.PayloadSettings
	actionscache.Settings
	bootstrap.KeySettings

	SVIDCert    string `envconfig:"GDR_SVID_CERT" desc:"gateway: PEM file of its X.509-SVID (read again when it changes); empty: the SPIFFE Workload API (SPIFFE_ENDPOINT_SOCKET)"`
	SVIDKey     string `envconfig:"GDR_SVID_KEY" desc:"gateway: PEM file of the SVID's private key (with GDR_SVID_CERT)"`
	SVIDBundle  string `envconfig:"GDR_SVID_BUNDLE" desc:"gateway: PEM file of the trust bundle (with GDR_SVID_CERT)"`
	MetricsAddr string `envconfig:"GDR_METRICS_ADDR" desc:"gateway: plain-HTTP listen address of /metrics, /healthz and /livez only (the mTLS listener serves executors alone); empty: none"`

	pools runnerpool.Pools
}

func main() {
	os.Exit(execute(context.Background(), os.Args[1:], os.Stderr))
}

// execute runs the command line args and returns the exit code.
func execute(ctx context.Context, args []string, stderr io.Writer) int {
	var cfg Config
	return program.Exec(ctx, &cfg, args, stderr, func(ctx context.Context, log *slog.Logger, _ []string) error {
		return serve(ctx, cfg, log)
	})
}

// Check checks what envconfig cannot, and loads the pools file.
func (c *Config) Check() error {
	var svid error
	if (c.SVIDCert == "") != (c.SVIDKey == "") || (c.SVIDCert == "") != (c.SVIDBundle == "") {
		svid = errors.New("GDR_SVID_CERT, GDR_SVID_KEY and GDR_SVID_BUNDLE go together")
	}
	pools, err := c.PoolSettings.Load()
	c.pools = pools
	return errors.Join(c.NamingSettings.Check(), c.PayloadSettings.Check(), c.KeySettings.Check(), svid, err, c.Settings.Check())
}

// giteaHTTPClient is the gateway's client of Gitea. Every executor's report
// passes through it, so it keeps as many idle connections to Gitea as calls
// it may have in flight (one per connection it serves,
// function.MaxConnections): Go's default transport keeps 2, and opens a new
// connection (against an HTTPS Gitea, a TLS handshake) for every call beyond
// them (docs/BENCHMARKS.md, "gateway": 4-5 new connections a second at 38
// calls/s). Idle connections still close after the transport's 90 s.
func giteaHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = function.MaxConnections
	t.MaxIdleConnsPerHost = function.MaxConnections
	return &http.Client{Timeout: 30 * time.Second, Transport: t}
}

func serve(ctx context.Context, cfg Config, log *slog.Logger) error {
	td, _, err := cfg.Parse()
	if err != nil {
		return err
	}
	clients, err := gitea.PoolClients(cfg.GiteaURL, giteaHTTPClient(), cfg.pools)
	if err != nil {
		return err
	}
	forwarders := make(map[string]gateway.Forwarder, len(clients))
	for name, c := range clients {
		forwarders[name] = c
	}
	verifier, err := cfg.KeySettings.Verifier()
	if err != nil {
		return err
	}
	nc, js, err := natsconn.Connect(ctx, cfg.ConnSettings, "gateway")
	if err != nil {
		return err
	}
	defer func() { _ = natsconn.Close(nc) }()
	payloads, err := assignmentqueue.OpenPayloads(ctx, js, cfg.PayloadBucket, cfg.PayloadKey, cfg.PayloadOldKeys...)
	if err != nil {
		return err
	}
	svids, bundles, closeSource, err := spiffeSource(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeSource()
	backendOf := make(map[string]taskassignment.BackendKind, len(cfg.pools))
	for _, p := range cfg.pools {
		backendOf[p.Name] = p.Backend
	}
	reg := metrics.NewRegistry()
	g := &gateway.Gateway{TrustDomain: td, Pools: forwarders, Payloads: payloads, Capabilities: verifier, Log: log, Observer: metrics.NewStarted(reg),
		// Finish notices name no stream: whichever captures ci.finished.> (dispatch and handle-setup ensure it).
		Finished: assignmentqueue.NewFinished(js, ""), Backends: backendOf}
	if cfg.CacheDir != "" {
		g.Cache = cfg.Settings.Open(cfg.CacheDir)
		log.Info("serving the actions cache", slog.String("dir", cfg.CacheDir))
	}
	requests := metrics.NewRequests(reg, "gateway", rpcNames...)
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opsDone := make(chan error, 1)
	if cfg.MetricsAddr != "" {
		probes := health.Probes{Log: log, Checks: []health.Check{
			{Name: "nats", Ready: natsconn.Connected(nc)},
			{Name: "svid", Ready: svidValid(svids, time.Now)},
		}}
		opsLn, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("GDR_METRICS_ADDR: %w", err)
		}
		log.Info("serving metrics and probes", slog.String("addr", opsLn.Addr().String()))
		go func() {
			err := function.Serve(ctx, function.Server(opsHandler(probes, reg), opsMaxBytes), opsLn)
			cancel() // the gateway does not run on without the probes its orchestrator expects
			opsDone <- err
		}()
	} else {
		opsDone <- nil
	}
	log.Info("serving executors", slog.String("addr", ln.Addr().String()), slog.Int("pools", len(forwarders)))
	srv := function.Server(requests.Wrap(g.Handler()), g.MaxBodyBytes())
	srv.TLSConfig = tlsconfig.MTLSServerConfig(svids, bundles, g.Authorizer())
	g.TrackConnections(srv)
	err = function.Serve(ctx, srv, ln)
	cancel()
	return errors.Join(err, <-opsDone)
}

// rpcNames are the runner protocol's RPCs, the method label values of the
// gateway's request counter.
var rpcNames = []string{"Register", "Declare", "FetchTask", "UpdateTask", "UpdateLog"}

// opsMaxBytes caps a request body on the metrics listener: it answers GETs.
const opsMaxBytes = 4 << 10

// opsHandler is the plain-HTTP listener's handler: probes and metrics,
// nothing of the runner protocol.
func opsHandler(probes health.Probes, g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	probes.Register(mux)
	metrics.Register(mux, g)
	return mux
}

// svidValid is the readiness check of the gateway's own SVID: one is
// available and now is within its leaf certificate's validity.
func svidValid(src x509svid.Source, now func() time.Time) func(context.Context) error {
	return func(context.Context) error {
		svid, err := src.GetX509SVID()
		if err != nil {
			return fmt.Errorf("gateway SVID: %w", err)
		}
		if len(svid.Certificates) == 0 {
			return errors.New("gateway SVID: no certificate")
		}
		leaf, t := svid.Certificates[0], now()
		if t.Before(leaf.NotBefore) || t.After(leaf.NotAfter) {
			return fmt.Errorf("gateway SVID %s: valid %s to %s only", svid.ID, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339))
		}
		return nil
	}
}

// spiffeSource returns the gateway's SVID and bundle sources: files when
// configured (read again when they change: a renewal of the certificate, a
// rotation of the installation's CA), else the Workload API, which keeps both
// rotated.
func spiffeSource(ctx context.Context, cfg Config, log *slog.Logger) (x509svid.Source, x509bundle.Source, func(), error) {
	if cfg.SVIDCert != "" {
		td, _, _ := cfg.Parse()
		src, err := svidfile.Open(td, cfg.SVIDCert, cfg.SVIDKey, cfg.SVIDBundle, svidfile.Options{OnError: func(err error) {
			log.Error("the SVID's files changed and could not be read: serving the last good ones", slog.Any("error", err))
		}})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("GDR_SVID_CERT, GDR_SVID_KEY, GDR_SVID_BUNDLE: %w", err)
		}
		return src, src, func() {}, nil
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	src, err := workloadapi.NewX509Source(wctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("SPIFFE Workload API: %w", err)
	}
	return src, src, func() { _ = src.Close() }, nil
}
