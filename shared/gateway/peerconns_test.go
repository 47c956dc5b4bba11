package gateway

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
)

// TestConnectionsCappedPerPeer: one executor that opens connection after connection, each
// carrying a request and then left open, gets MaxConnectionsPerPeer of them; the next is answered
// 429 and closed; another executor is still served meanwhile; and once one of the first
// executor's connections closes, it may open another.
func TestConnectionsCappedPerPeer(t *testing.T) {
	var g *Gateway
	f := startWith(t, func(gw *Gateway) { g = gw })
	addr := strings.TrimPrefix(f.url, "https://")
	dial := func(n int64) (*tls.Conn, *bufio.Reader) {
		t.Helper()
		svid, err := f.ca.Mint(taskID(n), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.Dial("tcp", addr, tlsconfig.MTLSClientConfig(svid, f.ca, tlsconfig.AuthorizeMemberOf(td)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c, bufio.NewReader(c)
	}
	// request sends one request (unauthenticated: no capability; it is refused after perPeer,
	// and its connection stays open) and returns the status and whether the server closes.
	request := func(c *tls.Conn, br *bufio.Reader) (int, bool) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, f.url+"/runner.v1.RunnerService/FetchTask", strings.NewReader(""))
		req.Header.Set("Content-Type", "application/proto")
		if err := req.Write(c); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		return res.StatusCode, res.Close
	}
	peer := taskID(7).String()
	var held []*tls.Conn
	for i := range MaxConnectionsPerPeer {
		c, br := dial(7)
		if code, closing := request(c, br); code == http.StatusTooManyRequests || closing {
			t.Fatalf("connection %d of one executor: %d (closing %v), want served and kept open", i+1, code, closing)
		}
		held = append(held, c)
	}
	if n := g.conns.open(peer); n != MaxConnectionsPerPeer {
		t.Fatalf("the executor holds %d counted connections, want %d: the fault did not happen", n, MaxConnectionsPerPeer)
	}
	c, br := dial(7)
	if code, closing := request(c, br); code != http.StatusTooManyRequests || !closing {
		t.Fatalf("connection %d of one executor: %d (closing %v), want 429 and closed", MaxConnectionsPerPeer+1, code, closing)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("the refused connection stays open: read %v", err)
	}
	other, obr := dial(8)
	if code, _ := request(other, obr); code == http.StatusTooManyRequests {
		t.Fatal("another executor is refused while the first holds its cap")
	}
	_ = held[0].Close()
	for deadline := time.Now().Add(5 * time.Second); g.conns.open(peer) >= MaxConnectionsPerPeer; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a closed connection still counts")
		}
	}
	c, br = dial(7)
	if code, closing := request(c, br); code == http.StatusTooManyRequests || closing {
		t.Fatalf("after one closed, a new connection of the executor: %d (closing %v), want served", code, closing)
	}
}
