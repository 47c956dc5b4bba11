package function

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"
)

// perSourceListener closes, at accept, a connection whose source address
// already holds max open connections: one client cannot take the
// listener's connection cap from the others. Wrapped by the cap
// (netutil.LimitListener), so a connection it closes never takes a slot.
type perSourceListener struct {
	net.Listener
	max int

	mu   sync.Mutex
	open map[netip.Addr]int
}

func (l *perSourceListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := sourceOf(c)
		if !l.take(addr) {
			_ = c.Close()
			continue
		}
		return &sourceConn{Conn: c, release: func() { l.release(addr) }}, nil
	}
}

func (l *perSourceListener) take(addr netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[addr] >= l.max {
		return false
	}
	if l.open == nil {
		l.open = map[netip.Addr]int{}
	}
	l.open[addr]++
	return true
}

func (l *perSourceListener) release(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[addr]--; l.open[addr] <= 0 {
		delete(l.open, addr) // the map holds addresses with open connections only
	}
}

// sourceOf is c's remote IP address (IPv4 in IPv6 unmapped); the zero Addr
// for a connection that is not IP (all such count as one source).
func sourceOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// sourceConn releases its source's count once, at its first Close.
type sourceConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *sourceConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// handshakeListener hands out TLS connections whose handshake completed,
// each handshake run on its own goroutine within timeout of its accept, so
// that a client that stalls before or in its handshake delays nobody else
// and holds its connection for timeout at most. The connections it returns
// are *tls.Conn (net/http reads the peer certificate from it); their
// handshake is done, so net/http's own is a no-op.
type handshakeListener struct {
	inner   net.Listener
	config  *tls.Config
	timeout time.Duration
	// logf reports a failed handshake, as net/http does when it runs the
	// handshake itself (a client with a certificate the server refuses).
	logf func(format string, args ...any)

	ready   chan net.Conn
	failed  chan error
	closing chan struct{}
	once    sync.Once
}

func newHandshakeListener(inner net.Listener, config *tls.Config, timeout time.Duration, logf func(string, ...any)) *handshakeListener {
	l := &handshakeListener{inner: inner, config: config, timeout: timeout, logf: logf,
		ready: make(chan net.Conn), failed: make(chan error), closing: make(chan struct{})}
	go l.accept()
	return l
}

// accept accepts until the inner listener fails for good, handing each
// connection to its own handshake; a temporary error is passed on (the
// server backs off) and accepting goes on.
func (l *handshakeListener) accept() {
	for {
		c, err := l.inner.Accept()
		if err != nil {
			select {
			case l.failed <- err:
			case <-l.closing:
				return
			}
			var temporary interface{ Temporary() bool } // as net/http's Serve tells one
			if errors.As(err, &temporary) && temporary.Temporary() {
				continue
			}
			return
		}
		go l.handshake(c)
	}
}

func (l *handshakeListener) handshake(c net.Conn) {
	tc := tls.Server(c, l.config)
	ctx := context.Background()
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
		_ = c.SetDeadline(time.Now().Add(l.timeout))
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		l.logf("http: TLS handshake error from %s: %v", c.RemoteAddr(), err)
		_ = tc.Close()
		return
	}
	_ = c.SetDeadline(time.Time{}) // the server sets its own from here on
	select {
	case l.ready <- tc:
	case <-l.closing:
		_ = tc.Close()
	}
}

func (l *handshakeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case err := <-l.failed:
		return nil, err
	case <-l.closing:
		return nil, net.ErrClosed
	}
}

func (l *handshakeListener) Close() error {
	l.once.Do(func() { close(l.closing) })
	return l.inner.Close()
}

func (l *handshakeListener) Addr() net.Addr { return l.inner.Addr() }
