package function

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

// startServe serves h on 127.0.0.1 as Serve does, with progress as the
// write progress timeout and at most maxConns connections, until the test
// ends; it returns the address.
func startServe(t *testing.T, h http.Handler, progress time.Duration, maxConns int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() {
		served <- ServeWithin(ctx, server(h, 0, progress), ln, Limits{MaxConnections: maxConns, PerSource: maxConns})
	}()
	t.Cleanup(func() { cancel(); <-served })
	return ln.Addr().String()
}

// A client that asks for a large response and never reads it holds its
// connection and the handler's goroutine for one write's progress timeout,
// not for ever: the blocked write fails, the handler returns, and other
// clients are served meanwhile. The fault is asserted first: the response
// is larger than the socket buffers, so the handler's write did block.
func TestWriteBoundedByProgress(t *testing.T) {
	const progress = 300 * time.Millisecond
	chunk := make([]byte, 1<<20)
	type result struct {
		written int
		err     error
		took    time.Duration
	}
	done := make(chan result, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /large", func(w http.ResponseWriter, _ *http.Request) {
		start, n := time.Now(), 0
		var err error
		for n < 256<<20 && err == nil { // 256 MiB: far more than any socket buffers hold
			var k int
			k, err = w.Write(chunk)
			n += k
		}
		done <- result{n, err, time.Since(start)}
	})
	mux.HandleFunc("GET /small", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	addr := startServe(t, mux, progress, 16)

	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if _, err := io.WriteString(silent, "GET /large HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// Another client is served while the silent one's response is stuck.
	resp, err := http.Get("http://" + addr + "/small")
	if err != nil {
		t.Fatalf("another client while one is silent: %v", err)
	}
	_ = resp.Body.Close()
	select {
	case r := <-done:
		if r.written >= 256<<20 || r.written < len(chunk) {
			t.Fatalf("the handler wrote %d bytes before its write failed: the fault (a write blocked on a silent client) did not happen as meant", r.written)
		}
		if r.err == nil || r.took > 10*progress+2*time.Second {
			t.Fatalf("the stuck write ended after %v with %v; want an error within about %v of the last progress", r.took, r.err, progress)
		}
		t.Logf("write to a silent client failed after %d bytes, %v: %v", r.written, r.took.Round(time.Millisecond), r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the handler writing to a silent client still blocks after 30 s")
	}
}

// A handler may take longer than the progress timeout before it writes (a
// dispatch round), and a connection's next response is not cut short by
// the deadline an earlier one left.
func TestWriteProgressLeavesThinkingAlone(t *testing.T) {
	const progress = 200 * time.Millisecond
	mux := http.NewServeMux()
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(3 * progress)
		w.WriteHeader(http.StatusAccepted)
	})
	addr := startServe(t, mux, progress, 16)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i := range 2 { // the second request on the same connection
		if _, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("request %d: %v, %v; want 202 after the handler's pause", i+1, resp, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
}

// A listener holds at most its cap of connections: past it, a new client
// waits (its request is not read) until one of them closes, and is then
// served.
func TestServeCapsConnections(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	addr := startServe(t, mux, time.Second, 2)
	var held []net.Conn
	for range 2 { // two idle connections, kept open: the cap
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	answered := make(chan error, 1)
	go func() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			answered <- err
			return
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
			answered <- err
			return
		}
		b, err := io.ReadAll(c)
		if err == nil && !strings.HasSuffix(string(b), "ok") {
			err = errors.New("unexpected answer " + string(b))
		}
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("a third connection was served while two were open (err %v): no cap", err)
	case <-time.After(500 * time.Millisecond):
	}
	_ = held[0].Close()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("the waiting client, once a connection closed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting client was not served within 10 s of a connection closing")
	}
}

// tlsConfigs returns a server configuration and a client's that trusts it.
func tlsConfigs(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	ca, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	svid, err := ca.Mint(spiffeid.RequireFromPath(td, "/gateway"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tlsconfig.TLSServerConfig(svid), tlsconfig.TLSClientConfig(ca, tlsconfig.AuthorizeID(svid.ID))
}

// startServeTLS serves h over TLS on 127.0.0.1 within limits until the test
// ends, its errors logged to errorLog (nil: discarded); it returns the
// address and a client configuration that trusts it.
func startServeTLS(t *testing.T, h http.Handler, limits Limits, errorLog io.Writer) (string, *tls.Config) {
	t.Helper()
	serverTLS, clientTLS := tlsConfigs(t)
	srv := server(h, 1<<10, time.Second)
	srv.TLSConfig = serverTLS
	srv.ErrorLog = log.New(cmp.Or(errorLog, io.Discard), "", 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- ServeWithin(ctx, srv, ln, limits) }()
	t.Cleanup(func() { cancel(); <-served })
	return ln.Addr().String(), clientTLS
}

// One executor (source 127.0.0.2) opens raw TCP connections and never sends
// a ClientHello, as many as the listener's cap; another (127.0.0.1) must
// still complete its calls within a second each. Before, the silent
// connections held every slot until the server's header timeout (10 s)
// and the other executor's calls waited in the backlog.
func TestSilentConnectionsOfOneSourceStallNoOther(t *testing.T) {
	const maxConns, perSource, within = 16, 4, time.Second
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	addr, clientTLS := startServeTLS(t, ok, Limits{MaxConnections: maxConns, PerSource: perSource, Handshake: 2 * time.Second}, nil)

	attacker := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	var silent []net.Conn
	for range maxConns {
		c, err := attacker.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	t.Cleanup(func() {
		for _, c := range silent {
			_ = c.Close()
		}
	})
	// The fault: the listener accepted the silent connections (each past
	// the first perSource is closed at once; the first perSource stay open).
	closed := 0
	for _, c := range silent {
		_ = c.SetReadDeadline(time.Now().Add(within / 4))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF || errors.Is(err, syscall.ECONNRESET) {
			closed++
		}
	}
	if open := maxConns - closed; open < perSource {
		t.Fatalf("only %d of one source's silent connections were held open: the fault did not happen", open)
	} else if open > perSource {
		t.Errorf("%d silent connections of one source held open, the cap per source is %d", open, perSource)
	}

	client := &http.Client{Timeout: within, Transport: &http.Transport{TLSClientConfig: clientTLS, DisableKeepAlives: true}}
	for i := range 5 {
		start := time.Now()
		resp, err := client.Get("https://" + addr + "/")
		if err != nil {
			t.Fatalf("call %d of another executor while one holds silent connections: %v (after %v)", i, err, time.Since(start))
		}
		_ = resp.Body.Close()
	}
}

// A connection that sends no ClientHello is closed after the handshake
// timeout, not the server's header timeout.
func TestSilentConnectionClosedAfterHandshakeTimeout(t *testing.T) {
	const handshake = 500 * time.Millisecond
	addr, _ := startServeTLS(t, http.NotFoundHandler(), Limits{MaxConnections: 4, PerSource: 4, Handshake: handshake}, nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(ReadHeaderTimeout))
	_, err = c.Read(make([]byte, 1))
	if took := time.Since(start); err == nil || took > handshake+time.Second {
		t.Fatalf("a silent connection ended after %v (%v), want closed within about %v", took, err, handshake)
	}
}

// A handshake that fails is logged, as net/http logs the ones it runs: a
// runner whose certificate the gateway refuses shows in the gateway's log.
func TestFailedHandshakeIsLogged(t *testing.T) {
	logged := make(logLines, 16)
	addr, _ := startServeTLS(t, http.NotFoundHandler(), Limits{MaxConnections: 4, PerSource: 4, Handshake: time.Second}, logged)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil { // not TLS
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.Copy(io.Discard, c) // until the server closes it
	_ = c.Close()
	select {
	case line := <-logged:
		if !strings.Contains(line, "TLS handshake error from 127.0.0.1:") {
			t.Fatalf("logged %q, want the failed handshake", line)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a failed handshake was not logged")
	}
}

// logLines is a log writer that sends each line on, dropping what finds no
// room (a log.Logger writes a line at a time).
type logLines chan string

func (l logLines) Write(p []byte) (int, error) {
	select {
	case l <- string(p):
	default:
	}
	return len(p), nil
}
