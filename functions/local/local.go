package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/process"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dirlock"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gateway"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/health"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics/dispatchmetrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics/recovermetrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/trigger/pull"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// Local mode's fixed naming: one pool, one trust domain, one machine.
const (
	poolName    = "local"
	trustDomain = "gdr.local"
	prefix      = "gitea-dynamic-runner.io"
)

// local is one running local mode.
type local struct {
	cfg Config
	// log says what a person wants to know: the job events, local mode's
	// start and stop, warnings; internal says what the cores do, its info
	// lines at debug level (internals).
	log, internal *slog.Logger
	// outage says once when Gitea stops answering and once when it is back.
	outage *outage

	// lock makes the state directory this process's alone: two local modes
	// on one directory would run two NATS servers on one store.
	lock *dirlock.Lock
	ns   *server.Server
	nc   *nats.Conn
	gw   *http.Server
	// rounds runs the dispatch rounds: polled at cadence's pace, and at
	// once when a webhook (Work) or a freed slot (kickDispatch) asks.
	rounds *dispatcher.Rounds
	hook   *http.Server
	ops    *http.Server // metrics and probes, with --metrics-addr
	reg    *prometheus.Registry
	// statusSource is what writeStatus reads the status file from.
	statusSource poolstatus.Source
	passes       *recovermetrics.Recover
	loops        sync.WaitGroup
	d            *dispatcher.Dispatcher
	pool         dispatcher.Pool
	job          pull.Assignments
	recover      *recoverer.Recoverer
	// recovering serializes the periodic pass and the finish of an ended
	// executor. Not needed for correctness (recover never creates an
	// executor, so concurrent passes converge); it saves duplicate calls.
	recovering sync.Mutex
	backend    *process.Backend
	exits      *exits // executors whose process ended, finished at once
}

// start brings everything up, failing fast, and in an order that writes
// nothing to the state directory but its lock before Gitea has accepted the
// registration: the lock, the registration, the queue (an embedded NATS),
// the executors' side (CA, bootstrap, gateway, process backend), then the
// cores that join them.
func start(ctx context.Context, cfg Config, log *slog.Logger) (*local, error) {
	reg := metrics.NewRegistry()
	l := &local{cfg: cfg, log: log, internal: slog.New(internals{log.Handler()}), reg: reg, passes: recovermetrics.NewRecover(reg),
		outage: &outage{log: log, url: cfg.GiteaURL}}
	lock, err := dirlock.Acquire(cfg.StateDir)
	var held *dirlock.HeldError
	switch {
	case errors.As(err, &held):
		holder := "a process that took it a moment ago"
		if held.Holder.PID != 0 {
			holder = held.Holder.String()
		}
		return nil, fmt.Errorf("another local mode runs with state directory %s: %s; stop it first, or give this one another --state-dir", cfg.StateDir, holder)
	case err != nil:
		return nil, err
	}
	l.lock = lock
	// The state directory holds the pool's credentials, keys and CA: it is
	// the user's alone, also when it existed before with a wider mode (the
	// lock creates a missing one 0700 and leaves an existing one as it is).
	if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
		return nil, l.fail(fmt.Errorf("make the state directory the user's alone: %w", err))
	}
	giteaClient, err := l.registration(ctx)
	if err != nil {
		return nil, l.fail(err)
	}
	events := newJobEvents(log)
	client := watched{registration: giteaClient, events: events}
	keys, err := l.keys()
	if err != nil {
		return nil, l.fail(err)
	}
	metaKeys, err := taskassignment.NewKeys(prefix)
	if err != nil {
		return nil, l.fail(err)
	}
	td := spiffeid.RequireTrustDomainFromString(trustDomain)
	js, err := l.startNATS()
	if err != nil {
		return nil, l.fail(err)
	}
	p := runnerpool.Pool{Name: poolName, Labels: cfg.labels(), Backend: taskassignment.BackendProcess, Capacity: cfg.Capacity}
	q, err := l.startQueue(ctx, js, keys, p)
	if err != nil {
		return nil, l.fail(err)
	}
	l.resumeJobs(ctx, q.payloads, events)
	boot, err := l.startExecutors(td, p, metaKeys, keys, q.payloads, client)
	if err != nil {
		return nil, l.fail(err)
	}
	l.wireCores(ctx, td, p, metaKeys, boot, q, client, events)
	if cfg.WebhookAddr != "" {
		if err := l.startWebhook(); err != nil {
			return nil, l.fail(err)
		}
	}
	if cfg.MetricsAddr != "" {
		if err := l.startOps(); err != nil {
			return nil, l.fail(err)
		}
	}
	// An executor is finished as soon as its process ends (exits); recover's
	// pass is the safety net for the ends nobody heard of: executors started
	// before a restart, whose exits died with the process that started
	// them, and finishes that failed.
	l.every(ctx, cfg.RecoverInterval, l.recoverOnce)
	l.loops.Go(func() { l.rounds.Poll(ctx, l.pool) })
	l.loop(ctx, l.handleOnce)
	l.loops.Go(func() { l.exits.run(ctx) })
	return l, nil
}

// queue is local mode's side of NATS: the signed assignment queue, the
// process backend's consumer of it, and the payload store.
type queue struct {
	*assignmentqueue.Queue
	signer   *assignmentsig.Signer
	consumer pull.Puller
	payloads *assignmentqueue.Payloads
	endings  *assignmentqueue.Endings
	js       jetstream.JetStream
}

// startQueue ensures the queue's streams, the consumer and the payload
// bucket of pool p on js.
func (l *local) startQueue(ctx context.Context, js jetstream.JetStream, keys keyFile, p runnerpool.Pool) (queue, error) {
	signer, err := assignmentsig.NewSigner(secretkey.Key(keys.Signing))
	if err != nil {
		return queue{}, err
	}
	signer = signer.WithTTL(runnerpool.Pools{p}.PayloadTTL()) // no message opens after its payload is gone
	q := assignmentqueue.New(js, "").SignedBy(signer)
	if err := q.EnsureStream(ctx); err != nil {
		return queue{}, err
	}
	if err := q.EnsureRejections(ctx); err != nil {
		return queue{}, err
	}
	consumer, err := q.OpenConsumer(ctx, taskassignment.BackendProcess, l.cfg.Capacity)
	if err != nil {
		return queue{}, err
	}
	bucket := assignmentqueue.Bucket{Name: assignmentqueue.DefaultPayloadBucket, TTL: runnerpool.Pools{p}.PayloadTTL()}
	payloads, err := assignmentqueue.EnsurePayloads(ctx, js, bucket, secretkey.Key(keys.Payload))
	if err != nil {
		return queue{}, err
	}
	bucket.Name = assignmentqueue.EndingsBucket(bucket.Name)
	endings, err := assignmentqueue.EnsureEndings(ctx, js, bucket)
	if err != nil {
		return queue{}, err
	}
	return queue{Queue: q, signer: signer, consumer: consumer, payloads: payloads, endings: endings, js: js}, nil
}

// resumeJobs tells events of the tasks an earlier local mode claimed whose
// payloads are still stored (they have not ended, or their end is not
// cleaned up yet), so that their finished lines keep their fields after a
// restart. What cannot be read is left out: those lines lose their fields.
func (l *local) resumeJobs(ctx context.Context, payloads *assignmentqueue.Payloads, events *jobEvents) {
	stored, err := payloads.Stored(ctx)
	if err != nil {
		l.internal.Debug("earlier jobs not resumed", slog.Any("error", err))
		return
	}
	for id, claimed := range stored {
		task, err := payloads.Get(ctx, id)
		if err != nil {
			l.internal.Debug("earlier job not resumed", slog.String("assignment", id), slog.Any("error", err))
			continue
		}
		events.resume(task, claimed)
	}
}

// startExecutors brings up the executors' side: the local CA that mints
// their SVIDs, the bootstrap they receive, the gateway they report through,
// and the process backend that starts them (this binary, as `runner`).
func (l *local) startExecutors(td spiffeid.TrustDomain, p runnerpool.Pool, metaKeys taskassignment.Keys, keys keyFile, payloads *assignmentqueue.Payloads, client gateway.Forwarder) (*bootstrap.Bootstrap, error) {
	ca, err := svidca.LoadOrCreate(filepath.Join(l.cfg.StateDir, "ca"), td)
	if err != nil {
		return nil, err
	}
	boot, err := bootstrap.New(secretkey.Key(keys.Bootstrap), "https://"+l.cfg.GatewayAddr, spiffeid.RequireFromPath(td, bootstrap.DefaultGatewayPath))
	if err != nil {
		return nil, err
	}
	if err := l.startGateway(td, ca, payloads, boot, client); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	l.exits = newExits(l.finishOnce, l.kickDispatch)
	backend, err := process.New(process.Config{
		Dir: filepath.Join(l.cfg.StateDir, "executors"), Runner: self, RunnerArgs: []string{"runner"},
		Pools: runnerpool.Pools{p}, Keys: metaKeys, TrustDomain: td, Minter: ca, Env: process.InheritedEnv(os.Environ()),
		OnCorrupt: func(name string, err error) {
			l.log.Error("executor with corrupt metadata skipped", slog.String("executor", name), slog.Any("error", err))
		},
		OnExit: l.exits.exited,
	})
	if err != nil {
		return nil, err
	}
	l.backend = backend
	return boot, nil
}

// wireCores joins the queue and the executors with the three cores, as
// dispatch, handle and recover would: the dispatcher and its rounds, the
// handler's job, the recoverer; and the metrics and status they feed.
func (l *local) wireCores(ctx context.Context, td spiffeid.TrustDomain, p runnerpool.Pool, metaKeys taskassignment.Keys, boot *bootstrap.Bootstrap, q queue,
	client watched, events *jobEvents) {
	backend, log, reg := l.backend, l.internal, l.reg
	reg.MustRegister(metrics.NewExecutors(map[taskassignment.BackendKind]metrics.ExecutorLister{taskassignment.BackendProcess: backend}, log))
	reg.MustRegister(metrics.NewConsumers(metrics.JetStreamConsumerInfo(q.js), q.Stream(), []string{string(taskassignment.BackendProcess)}, log))
	tasks := gitea.TaskState{Client: client}
	l.pool = dispatcher.Pool{Pool: p, Registration: client, Tasks: tasks}
	l.statusSource = poolstatus.Source{Payloads: q.payloads, Tasks: q.payloads,
		Executors: map[taskassignment.BackendKind]poolstatus.Executors{taskassignment.BackendProcess: backend},
		Consumers: metrics.JetStreamConsumerInfo(q.js).Backlogs(), Stream: q.Stream()}
	l.d = &dispatcher.Dispatcher{TrustDomain: td, Queue: q, Payloads: q.payloads, Log: log, Observer: dispatchmetrics.NewDispatch(reg)}
	cadence := &dispatcher.Cadence{Idle: l.cfg.PollInterval, Busy: l.cfg.BusyPollInterval, Window: l.cfg.BusyWindow, Backoff: giteaBackoff}
	l.rounds = dispatcher.NewRounds(ctx, l.dispatchOnce, cadence)
	worker := executor.Worker{Backend: backend, Tasks: tasks, Bootstrap: boot, Keys: metaKeys, Endings: q.endings,
		OnEvent: func(e executor.Event) {
			log.Debug(string(e.Name), slog.String("assignment", e.AssignmentID), slog.String("phase", string(e.Phase)))
			if e.Name == executor.EventExecutorCreated {
				events.running(e.TaskID, e.Executor)
			}
		}}
	l.job = pull.Assignments{
		Decider:  handler.Handler{Worker: worker, TrustDomain: td, Keys: q.signer, Observer: metrics.NewOutcomes(reg)},
		Log:      log,
		Consumer: q.consumer, Batch: l.cfg.Capacity,
	}
	l.recover = &recoverer.Recoverer{
		TrustDomain: td, Keys: metaKeys, Bootstrap: boot,
		Backends: map[taskassignment.BackendKind]executor.Backend{taskassignment.BackendProcess: backend},
		Pools:    map[string]recoverer.Pool{poolName: {Pool: p, Tasks: tasks}},
		Queue:    q, Sender: q, Rejections: q, Payloads: q.payloads, Endings: q.endings, Log: log,
	}
}

// registration loads the pool's credentials, or registers with the token,
// and checks them with Gitea before anything else is written.
func (l *local) registration(ctx context.Context) (*gitea.Client, error) {
	hc := &http.Client{Timeout: 30 * time.Second}
	store := gitea.FileStore{Path: filepath.Join(l.cfg.StateDir, "credentials.json")}
	creds, err := store.Load()
	fresh := false
	switch {
	case errors.Is(err, gitea.ErrNoCredentials):
		if l.cfg.RegistrationToken == "" {
			return nil, fmt.Errorf("this is the first start with state directory %s: a registration token is required (GDR_REGISTRATION_TOKEN or --registration-token-file)", l.cfg.StateDir)
		}
		creds, err = gitea.Register(ctx, l.cfg.GiteaURL, hc, gitea.Registration{
			Token: l.cfg.RegistrationToken, Name: "gitea-dynamic-runner-local", Labels: l.cfg.labels(),
		})
		if err != nil {
			return nil, explain(l.cfg.GiteaURL, "register", err)
		}
		fresh = true
	case err != nil:
		return nil, err
	}
	client, err := gitea.NewClient(l.cfg.GiteaURL, hc, creds)
	if err != nil {
		return nil, err
	}
	if err := client.Declare(ctx, l.cfg.labels()); err != nil {
		if gitea.CodeOf(err) == connect.CodeUnauthenticated {
			return nil, fmt.Errorf("Gitea no longer knows the runner registered in %s: delete it and start again with a registration token", store.Path)
		}
		return nil, explain(l.cfg.GiteaURL, "declare", err)
	}
	if fresh {
		if err := store.Save(creds); err != nil {
			return nil, err
		}
		l.log.Info("registered with Gitea", slog.Int64("runner_id", creds.ID), slog.String("credentials", store.Path))
	}
	return client, nil
}

// explain turns a failed call into a sentence about Gitea.
func explain(url, what string, err error) error {
	var e *gitea.Error
	if errors.As(err, &e) {
		switch e.Code {
		case connect.CodeUnavailable, connect.CodeDeadlineExceeded:
			return fmt.Errorf("cannot reach Gitea at %s: %s", url, e.Message)
		case connect.CodeUnknown, connect.CodeNotFound, connect.CodeInvalidArgument, connect.CodePermissionDenied, connect.CodeUnauthenticated:
			if what == "register" {
				return fmt.Errorf("Gitea at %s refused the registration token: %s", url, e.Message)
			}
		}
	}
	return fmt.Errorf("Gitea at %s: %s: %w", url, what, err)
}

// keyFile is keys.json: the capability, payload and assignment signing keys
// (base64 in JSON), each 32 random bytes.
type keyFile struct {
	Bootstrap []byte `json:"bootstrap"`
	Payload   []byte `json:"payload"`
	// Signing is the Ed25519 seed that signs assignments; a state directory
	// of an earlier version has none and gets one.
	Signing []byte `json:"signing,omitempty"`
}

// keys loads the keys, or creates those missing once.
func (l *local) keys() (keyFile, error) {
	path := filepath.Join(l.cfg.StateDir, "keys.json")
	data, err := os.ReadFile(path)
	var k keyFile
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return k, err
	default:
		if err := json.Unmarshal(data, &k); err != nil || len(k.Bootstrap) != 32 || len(k.Payload) != 32 || (k.Signing != nil && len(k.Signing) != 32) {
			return k, fmt.Errorf("%s is corrupt", path)
		}
		if k.Signing != nil {
			return k, nil
		}
	}
	for _, key := range []*[]byte{&k.Bootstrap, &k.Payload, &k.Signing} {
		if *key != nil {
			continue
		}
		*key = make([]byte, 32)
		if _, err := io.ReadFull(rand.Reader, *key); err != nil {
			return k, err
		}
	}
	data, err = json.Marshal(k)
	if err != nil {
		return k, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return k, err
	}
	return k, os.Rename(tmp, path)
}

func (l *local) startNATS() (jetstream.JetStream, error) {
	ns, err := server.NewServer(&server.Options{
		ServerName: "gdr-local", JetStream: true, StoreDir: filepath.Join(l.cfg.StateDir, "nats"),
		DontListen: true, NoSigs: true, NoLog: true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS did not start")
	}
	l.ns = ns
	nc, err := nats.Connect("", nats.InProcessServer(ns), nats.Name("gdr-local"))
	if err != nil {
		return nil, err // start fails, stopping what is started
	}
	l.nc = nc
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err // start fails, stopping what is started
	}
	return js, nil
}

func (l *local) startGateway(td spiffeid.TrustDomain, ca *svidca.CA, payloads *assignmentqueue.Payloads, boot *bootstrap.Bootstrap, client gateway.Forwarder) error {
	svid, err := ca.Mint(spiffeid.RequireFromPath(td, bootstrap.DefaultGatewayPath), 30*24*time.Hour)
	if err != nil {
		return err
	}
	g := &gateway.Gateway{TrustDomain: td, Pools: map[string]gateway.Forwarder{poolName: client},
		Payloads: payloads, Capabilities: boot, Log: l.internal, Observer: metrics.NewStarted(l.reg),
		Cache: l.cfg.Settings.Open(l.cfg.cacheDir())}
	ln, err := net.Listen("tcp", l.cfg.GatewayAddr)
	if err != nil {
		return fmt.Errorf("the gateway cannot listen on %s (is another local mode running? --gateway-addr picks another): %w", l.cfg.GatewayAddr, err)
	}
	requests := metrics.NewRequests(l.reg, "gateway", "Register", "Declare", "FetchTask", "UpdateTask", "UpdateLog")
	l.gw = function.Server(requests.Wrap(g.Handler()), g.MaxBodyBytes())
	l.gw.TLSConfig = tlsconfig.MTLSServerConfig(svid, ca, g.Authorizer())
	g.TrackConnections(l.gw)
	// stop shuts the servers down. Every executor connects from loopback:
	// no cap per source (it would be one cap for all jobs), the others hold.
	limits := function.DefaultLimits()
	limits.PerSource = 0
	go func() { _ = function.ServeWithin(context.Background(), l.gw, ln, limits) }()
	return nil
}

func (l *local) startWebhook() error {
	receiver := webhook.Receiver{Secret: []byte(l.cfg.WebhookSecret), OldSecrets: webhook.ParseSecrets(l.cfg.WebhookOldSecrets),
		Dedup: &webhook.Dedup{Size: 4096}, Log: l.internal,
		Observer: dispatchmetrics.NewJobs(l.reg, []runnerpool.Pool{l.pool.Pool})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhook", func(w http.ResponseWriter, r *http.Request) {
		job, ok := receiver.Receive(w, r)
		if !ok {
			return
		}
		if l.pool.Matches(job.Labels) {
			l.rounds.Work(l.pool)
		}
		w.WriteHeader(http.StatusAccepted)
	})
	ln, err := net.Listen("tcp", l.cfg.WebhookAddr)
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	l.hook = function.Server(mux, webhook.MaxDelivery)
	go func() { _ = function.Serve(context.Background(), l.hook, ln) }()
	return nil
}

// startOps serves metrics and probes (the embedded NATS connected) on
// --metrics-addr.
func (l *local) startOps() error {
	mux := http.NewServeMux()
	health.Probes{Log: l.internal, Checks: []health.Check{{Name: "nats", Ready: natsconn.Connected(l.nc)}}}.Register(mux)
	metrics.Register(mux, l.reg)
	ln, err := net.Listen("tcp", l.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	l.ops = function.Server(mux, opsMaxBytes)
	go func() { _ = function.Serve(context.Background(), l.ops, ln) }()
	l.log.Info("serving metrics", slog.String("url", "http://"+ln.Addr().String()+"/metrics"))
	return nil
}

// opsMaxBytes caps a request body on the metrics listener: it answers GETs.
const opsMaxBytes = 4 << 10

// every runs f now, then every interval, until ctx ends.
func (l *local) every(ctx context.Context, interval time.Duration, f func(context.Context)) {
	l.loops.Add(1)
	go func() {
		defer l.loops.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			f(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// loop runs f back to back until ctx ends.
func (l *local) loop(ctx context.Context, f func(context.Context)) {
	l.loops.Add(1)
	go func() {
		defer l.loops.Done()
		for ctx.Err() == nil {
			f(ctx)
		}
	}()
}

// dispatchOnce runs one dispatch round (l.rounds runs it, and shows its
// result to the cadence), logs it and writes the status file.
func (l *local) dispatchOnce(ctx context.Context, p dispatcher.Pool) (dispatcher.Result, error) {
	defer l.writeStatus(ctx)
	res, err := l.d.Dispatch(ctx, p)
	if err != nil {
		if ctx.Err() == nil {
			l.outage.failed(ctx, "dispatch round", err)
		}
		return res, err
	}
	l.outage.answered(ctx)
	l.internal.DebugContext(ctx, "dispatch round", slog.Int("claimed", len(res.Claimed)), slog.Int("in_flight", res.InFlight),
		slog.Int("ended", res.Ended), slog.Int("rejected", res.Rejected))
	return res, nil
}

func (l *local) handleOnce(ctx context.Context) {
	sum, err := l.job.Run(ctx)
	if err != nil && ctx.Err() == nil {
		l.log.Warn("handle run failed", slog.Any("error", err))
		time.Sleep(time.Second)
	}
	l.drainRejected(ctx, sum.Rejected)
}

// drainRejected fails at once the n tasks a handle run rejected, as
// recover's drain does, and frees their slots. Each termination's advisory
// reaches the rejection stream a moment after the termination, so it looks
// a few times, briefly; recover's pass is the safety net.
func (l *local) drainRejected(ctx context.Context, n int) {
	for attempt := 0; n > 0 && attempt < 20; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		l.recovering.Lock()
		sum, err := l.recover.Drain(ctx)
		l.recovering.Unlock()
		if err != nil && ctx.Err() == nil && !l.outage.unreachableOnly(ctx, "fail rejected tasks", err) {
			l.log.Warn("fail rejected tasks", slog.Any("error", err))
		}
		if done := sum.Rejected + sum.Exhausted + sum.RejectionsDropped; done > 0 {
			l.internal.Info("rejected tasks failed", sum.Attrs()...)
			l.kickDispatch()
			n -= done
		}
	}
}

// kickDispatch runs a dispatch round now (or right after the one that
// runs); it never blocks.
func (l *local) kickDispatch() { l.rounds.Wake(l.pool) }

// finishOnce finishes the executor of an assignment whose process ended, as
// recover would; true means the task's slot is free.
func (l *local) finishOnce(ctx context.Context, assignmentID string) bool {
	l.recovering.Lock()
	defer l.recovering.Unlock()
	sum, err := l.recover.Finish(ctx, l.backend, assignmentID)
	if err != nil && ctx.Err() == nil && !l.outage.unreachableOnly(ctx, "finish an ended executor", err) {
		l.log.Warn("finish an ended executor", slog.String("assignment", assignmentID), slog.Any("error", err))
	}
	return sum.Done > 0
}

func (l *local) recoverOnce(ctx context.Context) {
	l.recovering.Lock()
	defer l.recovering.Unlock()
	sum, err := l.recover.Run(ctx)
	if ctx.Err() == nil {
		l.passes.Pass(sum, err)
	}
	if err != nil && ctx.Err() == nil && !l.outage.unreachableOnly(ctx, "recover pass", err) {
		l.log.Warn("recover failed", slog.Any("error", err))
	}
	if sum != (recoverer.Summary{}) {
		l.internal.Info("recover", sum.Attrs()...)
	}
}

// wait blocks until ctx ends, then stops everything this process runs.
// Executors go on: they are processes of their own.
func (l *local) wait(ctx context.Context) {
	<-ctx.Done()
	l.loops.Wait()
	l.rounds.Wait(3 * dispatcher.ClaimTimeout)
	removeStatus(l.cfg.StateDir)
	l.shutdown()
}

func (l *local) shutdown() {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if l.hook != nil {
		_ = l.hook.Shutdown(c)
	}
	if l.ops != nil {
		_ = l.ops.Shutdown(c)
	}
	if l.gw != nil {
		_ = l.gw.Shutdown(c)
	}
	if l.nc != nil {
		_ = natsconn.Close(l.nc)
	}
	if l.ns != nil {
		l.ns.Shutdown()
		l.ns.WaitForShutdown()
	}
	if l.lock != nil {
		_ = l.lock.Release()
	}
}

// fail stops what start has started and returns err.
func (l *local) fail(err error) error {
	l.shutdown()
	return err
}
