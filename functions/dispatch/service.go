package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// service runs dispatch rounds on demand: per webhook, per tick, per interval.
type service struct {
	d        *dispatcher.Dispatcher
	pools    []dispatcher.Pool
	receiver webhook.Receiver
	ticks    function.Ticks
	log      *slog.Logger
}

func newHTTPService(d *dispatcher.Dispatcher, pools []dispatcher.Pool, secret []byte, ticks function.Ticks, log *slog.Logger) *service {
	return &service{d: d, pools: pools, log: log, ticks: ticks,
		receiver: webhook.Receiver{Secret: secret, Dedup: &webhook.Dedup{Size: 4096}, Log: log}}
}

// dispatchAll runs one round for each pool; an error of one pool does not
// stop the others.
func (s *service) dispatchAll(ctx context.Context, pools []dispatcher.Pool) error {
	var errs []error
	for _, p := range pools {
		res, err := s.d.Dispatch(ctx, p)
		attrs := []any{slog.String("pool", p.Name), slog.Int("claimed", len(res.Claimed)), slog.Int("in_flight", res.InFlight),
			slog.Int("free", res.Free), slog.Int("kept_alive", res.KeptAlive), slog.Int("ended", res.Ended), slog.Int("rejected", res.Rejected)}
		if err != nil {
			s.log.Error("dispatch round failed", append(attrs, slog.Any("error", err))...)
			errs = append(errs, err)
			continue
		}
		s.log.Info("dispatch round", attrs...)
	}
	return errors.Join(errs...)
}

func (s *service) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhook", s.webhook)
	mux.Handle("POST /{$}", s.ticks.Authorized(http.HandlerFunc(s.tick)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	return mux
}

// webhook answers a Gitea delivery: 401 for a bad signature, 400 for a body
// that is not a job delivery, 202 otherwise; a queued job triggers a round for
// the pools its labels match (before the answer, so a caller that sees 202
// knows the round ran).
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
	if err := s.dispatchAll(r.Context(), pools); err != nil {
		http.Error(w, "dispatch failed; see the log", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// tick runs a round for every pool (a PingSource event, or any POST to /).
func (s *service) tick(w http.ResponseWriter, r *http.Request) {
	if err := s.dispatchAll(r.Context(), s.pools); err != nil {
		http.Error(w, "dispatch failed; see the log", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// serve answers HTTP until ctx ends, and with interval > 0 also runs a round
// for every pool that often.
func (s *service) serve(ctx context.Context, addr string, interval time.Duration) error {
	s.log.Info("serving", slog.String("addr", addr), slog.Duration("interval", interval))
	if interval > 0 {
		done := make(chan struct{})
		defer func() { <-done }()
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel() // before the wait above: the loop ends when serving does
		go func() {
			defer close(done)
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					_ = s.dispatchAll(ctx, s.pools)
				}
			}
		}()
	}
	return function.ListenAndServe(ctx, function.Server(s.handler(), webhook.MaxDelivery), addr)
}
