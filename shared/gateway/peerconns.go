package gateway

import (
	"context"
	"net"
	"net/http"
	"sync"
)

// MaxConnectionsPerPeer caps the connections one executor (one SPIFFE ID)
// holds open on a gateway replica once they have carried a request: a runner
// needs a few (its reports, a cache transfer or two), and one that opens
// hundreds and leaves them idle between requests would hold the listener's
// connection cap (function.MaxConnections) from every other executor. Past
// it, the request on a further connection is answered 429, unread, and that
// connection closed. A connection that never sends a request counts only
// against the listener's cap, for at most the server's header timeout.
const MaxConnectionsPerPeer = 32

type connKey struct{}

// peerConns remembers, by peer, the connections that have carried a request
// and are still open; the zero value is ready.
type peerConns struct {
	mu     sync.Mutex
	byPeer map[string]map[net.Conn]struct{}
	peerOf map[net.Conn]string
}

// admit counts c for peer unless peer holds max other connections already;
// a connection counted before is admitted again.
func (p *peerConns) admit(peer string, c net.Conn, max int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.peerOf[c]; ok {
		return true
	}
	if len(p.byPeer[peer]) >= max {
		return false
	}
	if p.byPeer == nil {
		p.byPeer, p.peerOf = map[string]map[net.Conn]struct{}{}, map[net.Conn]string{}
	}
	if p.byPeer[peer] == nil {
		p.byPeer[peer] = map[net.Conn]struct{}{}
	}
	p.byPeer[peer][c] = struct{}{}
	p.peerOf[c] = peer
	return true
}

// closed forgets c.
func (p *peerConns) closed(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	peer, ok := p.peerOf[c]
	if !ok {
		return
	}
	delete(p.peerOf, c)
	if delete(p.byPeer[peer], c); len(p.byPeer[peer]) == 0 {
		delete(p.byPeer, peer) // the map holds peers with open connections only
	}
}

// open returns how many connections peer holds counted.
func (p *peerConns) open(peer string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byPeer[peer])
}

// TrackConnections installs on srv, the server of g's Handler, what the cap
// of MaxConnectionsPerPeer needs: every request's context carries its
// connection (ConnContext), and a connection that closes or is hijacked
// stops counting (ConnState). Hooks srv had already still run. Without it
// the cap is off, and MaxRequestsPerPeer alone holds.
func (g *Gateway) TrackConnections(srv *http.Server) {
	connContext, connState := srv.ConnContext, srv.ConnState
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if connContext != nil {
			ctx = connContext(ctx, c)
		}
		return context.WithValue(ctx, connKey{}, c)
	}
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateClosed || s == http.StateHijacked {
			g.conns.closed(c)
		}
		if connState != nil {
			connState(c, s)
		}
	}
}

// admitConn reports whether r's connection may carry requests of peer (see
// TrackConnections); true when connections are not tracked.
func (g *Gateway) admitConn(r *http.Request, peer string) bool {
	c, ok := r.Context().Value(connKey{}).(net.Conn)
	return !ok || g.conns.admit(peer, c, MaxConnectionsPerPeer)
}
