package actionscache

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The proxy holds at most its cap of connections: past it, a new one waits
// until one closes.
func TestProxyCapsConnections(t *testing.T) {
	p, err := startProxy("https://127.0.0.1:1", http.DefaultTransport, nil, time.Second, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	addr := strings.TrimPrefix(p.URL, "http://")
	addr = addr[:strings.Index(addr, "/")]
	var held []net.Conn
	for range 2 {
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
		if _, err := io.WriteString(c, "GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
			answered <- err
			return
		}
		b, err := io.ReadAll(c)
		if err == nil && !strings.HasPrefix(string(b), "HTTP/1.1 404") {
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
		t.Fatal("the waiting client was not served after a connection closed")
	}
}

// A job that stops reading an archive loses its connection: the proxy's
// writes must progress.
func TestProxyWriteBoundedByProgress(t *testing.T) {
	const size = 256 << 20
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = io.Copy(w, io.LimitReader(zeros{}, size))
	}))
	defer upstream.Close()
	p, err := startProxy(upstream.URL, upstream.Client().Transport, nil, 200*time.Millisecond, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	addr := strings.TrimPrefix(p.URL, "http://")
	path := addr[strings.Index(addr, "/"):] + "_apis/artifactcache/artifacts/1"
	c, err := net.Dial("tcp", addr[:strings.Index(addr, "/")])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(64 << 10)
	}
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the job stops reading
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, _ := io.Copy(io.Discard, c)
	if n >= size {
		t.Fatalf("a client that stopped reading for 2 s still got all %d bytes: writes are not bounded", n)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
