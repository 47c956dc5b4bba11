package function

import (
	"context"
	"crypto/tls"
	"errors"
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
)

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

// Serve answers srv's requests on ln, at most MaxConnections connections at
// once, until ctx ends, then shuts it down, letting the requests in flight
// finish within ShutdownGrace. It returns nil after a clean shutdown, and
// the error that stopped it otherwise.
//
// With srv.TLSConfig set, Serve terminates TLS itself, over the capped
// listener: ln must be a plain TCP listener. (A TLS listener wrapped by the
// cap would hide the *tls.Conn from net/http, and with it every request's
// peer certificate.)
func Serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
	return serve(ctx, srv, ln, MaxConnections)
}

func serve(ctx context.Context, srv *http.Server, ln net.Listener, maxConns int) error {
	ln = netutil.LimitListener(ln, maxConns)
	if srv.TLSConfig != nil {
		ln = tls.NewListener(ln, srv.TLSConfig)
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
