package function

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
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
)

// Server returns the HTTP server of h with every function's timeouts, its
// request bodies capped at maxBody bytes (a larger one reads as an error
// that http.MaxBytesError names; 0 leaves them uncapped: only for a handler
// that caps every body itself). There is no write timeout: a handler may
// run a whole dispatch round or recover pass before it answers.
func Server(h http.Handler, maxBody int64) *http.Server {
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

// Serve answers srv's requests on ln until ctx ends, then shuts it down,
// letting the requests in flight finish within ShutdownGrace. It returns nil
// after a clean shutdown, and the error that stopped it otherwise.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
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
