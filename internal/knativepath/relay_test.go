//go:build e2e

package knativepath

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
)

// request is one CloudEvent request a relay saw: the event's id, when it
// came, the answer it got, and the request itself (to send again).
type request struct {
	EventID string
	At      time.Time
	Status  int
	Header  http.Header
	Body    []byte
}

// relay is an HTTP proxy of the test's on 127.0.0.1 that records every
// CloudEvent request it forwards. As a tap in front of the channel's
// ingress it keeps what dispatch published, byte for byte.
//
// With hold set it also simulates a scheduling wait between the channel and
// handle: for hold after the first request of each event (forever when
// hold is negative) it answers 503 itself, as handle does while an
// executor's identity target is pending, and forwards only afterwards. The
// process backend's executors never wait for one (their identity target is
// always ready), so this is how the channel's redelivery of a "not yet" is
// exercised.
type relay struct {
	URL string

	target *url.URL
	hold   time.Duration
	proxy  *httputil.ReverseProxy

	mu    sync.Mutex
	first map[string]time.Time
	seen  []request
}

// newRelay starts a relay to target (a URL); hold as above (0: none). It is
// closed when the test ends.
func newRelay(t *testing.T, target string, hold time.Duration) *relay {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{target: u, hold: hold, proxy: httputil.NewSingleHostReverseProxy(u), first: map[string]time.Time{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	r.URL = "http://" + ln.Addr().String()
	return r
}

func (r *relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rec := request{At: time.Now(), Header: req.Header.Clone(), Body: body}
	parse := req.Clone(req.Context())
	parse.Body = io.NopCloser(bytes.NewReader(body))
	if ev, err := cehttp.NewEventFromHTTPRequest(parse); err == nil {
		rec.EventID = ev.ID()
	}
	r.mu.Lock()
	first, ok := r.first[rec.EventID]
	if !ok {
		first = rec.At
		r.first[rec.EventID] = first
	}
	r.mu.Unlock()

	var status int
	if r.hold != 0 && (r.hold < 0 || rec.At.Sub(first) < r.hold) {
		status = http.StatusServiceUnavailable
		http.Error(w, "the relay simulates a scheduling wait", status)
	} else {
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		r.proxy.ServeHTTP(sw, req)
		status = sw.status
	}
	rec.Status = status
	r.mu.Lock()
	r.seen = append(r.seen, rec)
	r.mu.Unlock()
}

// requests returns the requests of event id (every event for ""), oldest
// first.
func (r *relay) requests(id string) []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []request
	for _, q := range r.seen {
		if id == "" || q.EventID == id {
			out = append(out, q)
		}
	}
	return out
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// resend posts a recorded request again, unchanged, to target, and returns
// the answer's status.
func resend(t *testing.T, target string, q request) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, target, bytes.NewReader(q.Body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range q.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Content-Length", "Host", "Connection", "Accept-Encoding", "X-Forwarded-For":
			continue
		}
		req.Header[k] = vs
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("post the event again to %s: %v", target, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
