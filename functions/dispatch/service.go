package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/health"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// roundsGrace bounds how long serve waits, once its context has ended, for
// the rounds in flight: a cancelled round claims nothing more, and the claim
// in flight takes at most a FetchTask, a payload write and a final report,
// each bounded by dispatcher.ClaimTimeout.
const roundsGrace = 3 * dispatcher.ClaimTimeout

// service runs dispatch rounds on demand: per webhook, per tick, per interval
// in the background (rounds), and `dispatch run` in the foreground.
type service struct {
	d        *dispatcher.Dispatcher
	pools    []dispatcher.Pool
	receiver webhook.Receiver
	ticks    function.TickSettings
	rounds   *dispatcher.Rounds
	// cadence paces serve's polling of each pool; nil: serve polls not at
	// all (webhooks and ticks only).
	cadence *dispatcher.Cadence
	log     *slog.Logger
	// probes answer /healthz (NATS connected, Gitea reachable) and /livez; without checks
	// (a test) the service is always ready.
	probes health.Probes
	// metrics answers /metrics; nil (a test) serves none.
	metrics prometheus.Gatherer
}

// newHTTPService returns the service of pools; its background rounds run on
// ctx and stop claiming when it ends. Its webhook takes deliveries signed
// with secret or any of oldSecrets (none checked when secret is empty).
// cadence paces serve's polling of each pool; nil: serve polls not at all
// (webhooks and ticks only).
func newHTTPService(ctx context.Context, d *dispatcher.Dispatcher, pools []dispatcher.Pool, secret []byte, oldSecrets [][]byte, ticks function.TickSettings,
	cadence *dispatcher.Cadence, log *slog.Logger) *service {
	s := &service{d: d, pools: pools, log: log, ticks: ticks, cadence: cadence,
		receiver: webhook.Receiver{Secret: secret, OldSecrets: oldSecrets, Dedup: &webhook.Dedup{Size: 4096}, Log: log}}
	s.rounds = dispatcher.NewRounds(ctx, s.dispatch, cadence)
	return s
}

// dispatchAll runs one round for each pool; an error of one pool does not
// stop the others.
func (s *service) dispatchAll(ctx context.Context, pools []dispatcher.Pool) error {
	var errs []error
	for _, p := range pools {
		_, err := s.dispatch(ctx, p)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// dispatch runs one round for p and logs what it did.
func (s *service) dispatch(ctx context.Context, p dispatcher.Pool) (dispatcher.Result, error) {
	res, err := s.d.Dispatch(ctx, p)
	attrs := []any{slog.String("pool", p.Name), slog.Int("claimed", len(res.Claimed)), slog.Int("in_flight", res.InFlight),
		slog.Int("free", res.Free), slog.Int("kept_alive", res.KeptAlive), slog.Int("ended", res.Ended),
		slog.Int("unbeaten", res.Unbeaten), slog.Int("rejected", res.Rejected)}
	if err != nil {
		s.log.Error("dispatch round failed", append(attrs, slog.Any("error", err))...)
		return res, err
	}
	level := slog.LevelDebug // polled often: an idle round is no news
	if len(res.Claimed) > 0 || res.KeptAlive > 0 || res.Ended > 0 || res.Unbeaten > 0 || res.Rejected > 0 {
		level = slog.LevelInfo
	}
	s.log.Log(ctx, level, "dispatch round", attrs...)
	return res, nil
}

func (s *service) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhook", s.webhook)
	mux.Handle("POST /{$}", s.ticks.Authorized(http.HandlerFunc(s.tick)))
	s.probes.Register(mux)
	if s.metrics != nil {
		metrics.Register(mux, s.metrics)
	}
	return mux
}

// webhook answers a Gitea delivery: 401 for a bad signature, 400 for a body
// that is not a job delivery, 202 otherwise, at once; a queued job wakes a
// round of the pools its labels match, which runs after the answer.
func (s *service) webhook(w http.ResponseWriter, r *http.Request) {
	job, ok := s.receiver.Receive(w, r)
	if !ok {
		return
	}
	var pools []dispatcher.Pool
	for _, p := range s.pools {
		if p.Matches(job.Labels) {
			pools = append(pools, p)
		}
	}
	if len(pools) == 0 {
		http.Error(w, "ignored: no pool has these labels", http.StatusAccepted)
		return
	}
	s.log.Debug("webhook wakes a round", slog.Int64("job_id", job.JobID), slog.Int64("run_id", job.RunID))
	s.rounds.Work(pools...)
	w.WriteHeader(http.StatusAccepted)
}

// tick wakes a round of every pool (a PingSource event, or any POST to /)
// and answers 202 at once.
func (s *service) tick(w http.ResponseWriter, _ *http.Request) {
	s.rounds.Wake(s.pools...)
	w.WriteHeader(http.StatusAccepted)
}

// serve answers HTTP until ctx (the context the service was made with) ends,
// and with a cadence also polls: each pool's round follows the end of its
// last one (from any trigger) after the cadence's interval. It returns once
// the rounds in flight have ended, or after roundsGrace.
func (s *service) serve(ctx context.Context, addr string) error {
	s.log.Info("serving", slog.String("addr", addr))
	defer func() {
		if !s.rounds.Wait(roundsGrace) {
			s.log.Warn("dispatch rounds still running at exit", slog.Duration("waited", roundsGrace))
		}
	}()
	if s.cadence != nil {
		var loops sync.WaitGroup
		defer loops.Wait()
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel() // before the wait above: the loops end when serving does
		s.log.Info("polling", slog.Duration("interval", s.cadence.Idle), slog.Duration("busy_interval", s.cadence.Busy),
			slog.Duration("busy_window", s.cadence.Window))
		loops.Go(func() { s.rounds.Poll(ctx, s.pools...) })
	}
	return function.ListenAndServe(ctx, function.Server(s.handler(), webhook.MaxDelivery), addr)
}
