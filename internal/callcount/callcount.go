// Package callcount counts HTTP calls by name, on either side of a
// connection: a client's calls (Transport, in front of the client's own
// transport) or a server's deliveries (Handler, in front of its handler).
// Benchmarks use it to report what a component costs a peer, e.g. Gitea's
// runner-protocol calls per claimed task (FetchTask, UpdateTask, ...), or the
// webhooks a receiver was sent.
//
// A call is counted once its request is handed on (sent by the next
// transport, or served by the next handler), whatever its answer: a failed
// call costs the peer as much as one that succeeded, and is also counted
// under Failed when the transport returned an error or the answer was a 5xx.
// Only the standard library is used here, so any package's tests may import
// it.
package callcount

import (
	"maps"
	"net/http"
	"path"
	"sync"
)

// Name is the key a request is counted under: the last segment of its path,
// which for the runner protocol (Connect, .../runner.v1.RunnerService/<Method>)
// is the method. A request to "/" counts as "/".
func Name(r *http.Request) string {
	return path.Base(path.Clean("/" + r.URL.Path))
}

// Counter holds counts by name. The zero value is ready; it is safe for
// concurrent use.
type Counter struct {
	mu     sync.Mutex
	calls  map[string]int64
	failed map[string]int64
}

// Add counts one call of name, and one failure of it when failed.
func (c *Counter) Add(name string, failed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls, c.failed = map[string]int64{}, map[string]int64{}
	}
	c.calls[name]++
	if failed {
		c.failed[name]++
	}
}

// Counts returns a copy of the calls counted so far, by name.
func (c *Counter) Counts() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.calls)
}

// Failed returns a copy of the failures counted so far, by name.
func (c *Counter) Failed() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.failed)
}

// Since returns, by name, what Counts adds to before (an earlier Counts):
// the calls of a window. Names with no call in the window are left out.
func Since(now, before map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range now {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// Transport returns next (http.DefaultTransport when nil) counting every
// request it sends under Name.
func (c *Counter) Transport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return transport{c: c, next: next}
}

type transport struct {
	c    *Counter
	next http.RoundTripper
}

func (t transport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	t.c.Add(Name(r), err != nil || resp.StatusCode >= 500)
	return resp, err
}

// Handler returns next counting every request it serves under key(r)
// (Name when key is nil).
func (c *Counter) Handler(key func(*http.Request) string, next http.Handler) http.Handler {
	if key == nil {
		key = Name
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := key(r)
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		c.Add(name, sw.status >= 500)
	})
}

// statusWriter remembers the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}
