package function

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/writeprogress"
)

// The timeouts of every function's HTTP server. Bodies are capped per
// listener by Serve's limit; a handler may cap tighter.
const (
	// ReadHeaderTimeout bounds a request's headers: a slow client cannot
	// hold a connection open without sending one.
	ReadHeaderTimeout = 10 * time.Second
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout = time.Minute
	// IdleTimeout closes a keep-alive connection that sends nothing.
	IdleTimeout = 2 * time.Minute
	// ShutdownGrace is how long requests in flight may finish after the
	// context ends, before their connections are closed.
	ShutdownGrace = 30 * time.Second
	// WriteProgressTimeout bounds each write of a response, not the whole
	// response: a handler may think for as long as it needs before it
	// answers (a dispatch round, a recover pass) and stream for as long as
	// its client reads (a cache archive), but a client that stops reading
	// loses its connection this long after the write it left blocked.
	WriteProgressTimeout = 30 * time.Second
	// MaxConnections caps the connections one listener holds open at once
	// (each costs a descriptor and a goroutine, a TLS one a handshake's
	// memory): past it, new connections wait in the kernel's backlog until
	// one closes, and the server keeps serving those it has.
	MaxConnections = 512
	// MaxConnectionsPerSource caps the connections one source address (an
	// executor Pod, with its sidecars) holds on a listener, counted from
	// accept, before any byte of TLS or HTTP: past it, a new connection of
	// that address is closed at once, without taking one of
	// MaxConnections. It is twice the gateway's cap per executor identity,
	// which only counts once a request authenticated.
	MaxConnectionsPerSource = 64
	// HandshakeTimeout bounds a TLS handshake from accept: a connection
	// that sends no ClientHello, or stalls in the handshake, is closed
	// after it, instead of holding its slot for ReadHeaderTimeout.
	HandshakeTimeout = 5 * time.Second
)

// Limits bound a listener's connections before any request is read.
type Limits struct {
	// MaxConnections caps the connections held at once.
	MaxConnections int
	// PerSource caps the connections of one source address; 0: no cap but
	// MaxConnections (local mode's gateway, whose executors all connect
	// from loopback).
	PerSource int
	// Handshake bounds each TLS handshake (with a TLS configuration).
	Handshake time.Duration
}

// DefaultLimits are Serve's limits.
func DefaultLimits() Limits {
	return Limits{MaxConnections: MaxConnections, PerSource: MaxConnectionsPerSource, Handshake: HandshakeTimeout}
}

// Server returns the HTTP server of h with every function's timeouts, its
// request bodies capped at maxBody bytes (a larger one reads as an error
// that http.MaxBytesError names; 0 leaves them uncapped: only for a handler
// that caps every body itself). Writes are bounded by progress
// (WriteProgressTimeout), not as a whole: a handler may run a whole
// dispatch round or recover pass before it answers.
func Server(h http.Handler, maxBody int64) *http.Server {
	return server(h, maxBody, WriteProgressTimeout)
}

func server(h http.Handler, maxBody int64, progress time.Duration) *http.Server {
	h = writeprogress.Handler(h, progress)
	if maxBody > 0 {
		h = http.MaxBytesHandler(h, maxBody)
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
}

// Serve answers srv's requests on ln within DefaultLimits() until ctx ends,
// then shuts it down, letting the requests in flight finish within
// ShutdownGrace. It returns nil after a clean shutdown, and the error that
// stopped it otherwise.
//
// With srv.TLSConfig set, Serve terminates TLS itself, over the capped
// listener: ln must be a plain TCP listener. (A TLS listener wrapped by the
// cap would hide the *tls.Conn from net/http, and with it every request's
// peer certificate.) Each handshake runs on its own, bounded by
// Limits.Handshake, and only a connection whose handshake completed
// reaches srv: a client that opens connections and sends nothing holds at
// most PerSource of them, each for at most Handshake, and never delays
// another client's handshake or requests.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
	return ServeWithin(ctx, srv, ln, DefaultLimits())
}

// ServeWithin is Serve within other limits.
func ServeWithin(ctx context.Context, srv *http.Server, ln net.Listener, limits Limits) error {
	if limits.PerSource > 0 {
		ln = &perSourceListener{Listener: ln, max: limits.PerSource}
	}
	ln = netutil.LimitListener(ln, limits.MaxConnections)
	if srv.TLSConfig != nil {
		logf := log.Printf // net/http's own choice without an ErrorLog
		if srv.ErrorLog != nil {
			logf = srv.ErrorLog.Printf
		}
		ln = newHandshakeListener(ln, srv.TLSConfig, limits.Handshake, logf)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ListenAndServe listens on addr (TCP) and serves srv there as Serve does.
func ListenAndServe(ctx context.Context, srv *http.Server, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return Serve(ctx, srv, ln)
}
