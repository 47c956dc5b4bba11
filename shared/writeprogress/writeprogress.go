// Package writeprogress bounds an HTTP server's writes by progress rather
// than as a whole: each write of a response (headers, body, flush) must
// complete within a bound of its start. A handler may think for as long as
// it needs before it answers, and stream for as long as its client reads,
// but a client that stops reading loses its connection that long after the
// write it left blocked, and the handler its goroutine. http.Server's
// WriteTimeout cannot say that: it bounds the whole response.
package writeprogress

import (
	"net/http"
	"time"
)

// Handler wraps h so that every write of its responses completes within d
// of its start, and what net/http writes after h returns within d of that.
// Before h writes, the connection has no write deadline, whatever an
// earlier response on it left.
func Handler(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{})
		h.ServeHTTP(&writer{ResponseWriter: w, rc: rc, d: d}, r)
		_ = rc.SetWriteDeadline(time.Now().Add(d))
	})
}

// writer moves its connection's write deadline d ahead before each write.
type writer struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (p *writer) progress() { _ = p.rc.SetWriteDeadline(time.Now().Add(p.d)) }

func (p *writer) WriteHeader(code int) {
	p.progress()
	p.ResponseWriter.WriteHeader(code)
}

func (p *writer) Write(b []byte) (int, error) {
	p.progress()
	return p.ResponseWriter.Write(b)
}

// Flush flushes what the handler wrote, within d (httputil.ReverseProxy
// flushes as it streams).
func (p *writer) Flush() {
	p.progress()
	_ = p.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (p *writer) Unwrap() http.ResponseWriter { return p.ResponseWriter }
