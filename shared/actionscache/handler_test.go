package actionscache

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// scoped serves the handler to a caller of scope s, as the gateway would
// after authenticating it; the zero Scope is an unauthenticated caller.
func scoped(h http.Handler, s *Scope) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if *s != (Scope{}) {
			r = r.WithContext(WithScope(r.Context(), *s))
		}
		h.ServeHTTP(w, r)
	})
}

// protocolClient speaks the protocol as @actions/cache does, through url.
type protocolClient struct {
	t   *testing.T
	url string // ACTIONS_CACHE_URL
	hc  *http.Client
	// base is sent as HeaderBase unless empty (the proxy sets it itself).
	base string
}

func (c protocolClient) do(method, path string, body io.Reader, hdr map[string]string) (int, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.url+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer gitea-runtime-token")
	if c.base != "" {
		req.Header.Set(HeaderBase, c.base)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, data
}

func (c protocolClient) save(key, content string) int {
	c.t.Helper()
	status, data := c.do("POST", "_apis/artifactcache/caches", strings.NewReader(fmt.Sprintf(`{"key":%q,"version":"v1","cacheSize":%d}`, key, len(content))), nil)
	if status != http.StatusOK {
		return status
	}
	var r struct {
		CacheID int64 `json:"cacheId"`
	}
	if err := json.Unmarshal(data, &r); err != nil || r.CacheID == 0 {
		c.t.Fatalf("reserve answered %s", data)
	}
	path := fmt.Sprintf("_apis/artifactcache/caches/%d", r.CacheID)
	if status, data := c.do("PATCH", path, strings.NewReader(content), map[string]string{
		"Content-Type": "application/octet-stream", "Content-Range": fmt.Sprintf("bytes 0-%d/*", len(content)-1)}); status/100 != 2 {
		c.t.Fatalf("upload: %d %s", status, data)
	}
	status, data = c.do("POST", path, strings.NewReader(fmt.Sprintf(`{"size":%d}`, len(content))), nil)
	if status/100 != 2 {
		c.t.Fatalf("commit: %d %s", status, data)
	}
	return status
}

// restore returns the status of the lookup and the content of a hit.
func (c protocolClient) restore(key string) (int, string) {
	c.t.Helper()
	status, data := c.do("GET", "_apis/artifactcache/cache?keys="+key+"&version=v1", nil, nil)
	if status != http.StatusOK {
		return status, ""
	}
	var r struct {
		ArchiveLocation string `json:"archiveLocation"`
		CacheKey        string `json:"cacheKey"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		c.t.Fatal(err)
	}
	if !strings.HasPrefix(r.ArchiveLocation, c.url) {
		c.t.Fatalf("archiveLocation %s is not under ACTIONS_CACHE_URL %s", r.ArchiveLocation, c.url)
	}
	res, err := c.hc.Get(r.ArchiveLocation) // @actions/cache downloads without credentials
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		c.t.Fatalf("download: %d %s", res.StatusCode, body)
	}
	return status, string(body)
}

func TestProtocolRoundTripAndScoping(t *testing.T) {
	c, _ := newCache(t, Limits{MaxBytes: 1 << 20, MaxEntries: 10, MaxAge: time.Hour})
	scope := mainA
	srv := httptest.NewServer(scoped(Handler(c, nil), &scope))
	defer srv.Close()
	client := protocolClient{t: t, url: srv.URL + "/", hc: srv.Client(), base: srv.URL + "/"}
	if status := client.save("deps", "node_modules.tzst"); status/100 != 2 {
		t.Fatalf("save: %d", status)
	}
	if status, got := client.restore("deps"); status != 200 || got != "node_modules.tzst" {
		t.Fatalf("restore = %d %q", status, got)
	}
	if status := client.save("deps", "again"); status != http.StatusConflict {
		t.Fatalf("a second save of a key = %d, want 409 (@actions/cache: another job may be creating it)", status)
	}
	scope = mainB
	if status, _ := client.restore("deps"); status != http.StatusNoContent {
		t.Fatalf("another repository's restore = %d, want 204", status)
	}
	scope = Scope{}
	if status, _ := client.do("GET", "_apis/artifactcache/cache?keys=deps&version=v1", nil, nil); status != http.StatusUnauthorized {
		t.Fatalf("a request without scope = %d, want 401", status)
	}
}

func TestArchiveBaseMustBeLoopbackHTTP(t *testing.T) {
	for _, tc := range []struct {
		base string
		ok   bool
	}{
		{"http://127.0.0.1:4567/abc/", true},
		{"http://[::1]:4567/abc/", true},
		{"https://127.0.0.1:4567/abc/", false},
		{"http://evil.example.org:80/", false},
		{"http://10.0.0.1:80/", false},
		{"http://127.0.0.1/abc/", false},
		{"http://127.0.0.1:4567/abc", false},
		{"", false},
	} {
		if _, err := archiveBase(tc.base); (err == nil) != tc.ok {
			t.Errorf("archiveBase(%q) = %v, want ok=%v", tc.base, err, tc.ok)
		}
	}
}

func TestBodiesAreCapped(t *testing.T) {
	c, _ := newCache(t, Limits{MaxBytes: 1 << 30, MaxEntries: 10, MaxAge: time.Hour})
	scope := mainA
	srv := httptest.NewServer(scoped(Handler(c, nil), &scope))
	defer srv.Close()
	client := protocolClient{t: t, url: srv.URL + "/", hc: srv.Client(), base: srv.URL + "/"}
	// A JSON body over MaxJSONBytes.
	big := `{"key":"k","version":"` + strings.Repeat("v", MaxJSONBytes) + `"}`
	if status, _ := client.do("POST", "_apis/artifactcache/caches", strings.NewReader(big), nil); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("a large JSON body = %d, want 413", status)
	}
	status, data := client.do("POST", "_apis/artifactcache/caches", strings.NewReader(`{"key":"k","version":"v1"}`), nil)
	if status != 200 {
		t.Fatalf("reserve = %d %s", status, data)
	}
	var r struct{ CacheID int64 }
	_ = json.Unmarshal(data, &r)
	path := fmt.Sprintf("_apis/artifactcache/caches/%d", r.CacheID)
	// A chunk whose range is over MaxChunkBytes is refused before its body is read.
	body := &countingReader{n: MaxChunkBytes + 1}
	if status, _ := client.do("PATCH", path, body, map[string]string{"Content-Range": fmt.Sprintf("bytes 0-%d/*", MaxChunkBytes)}); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("a chunk over the cap = %d, want 413", status)
	}
	if body.read() > 32<<20 { // socket buffers, not the 128 MiB
		t.Fatalf("the server read %d bytes of a refused chunk", body.read())
	}
	// A body longer than its Content-Range says.
	if status, _ := client.do("PATCH", path, strings.NewReader("0123456789"), map[string]string{"Content-Range": "bytes 0-3/*"}); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body longer than its range = %d, want 413", status)
	}
	if status, _ := client.do("PATCH", path, strings.NewReader("0123"), map[string]string{"Content-Range": "0-3"}); status != http.StatusBadRequest {
		t.Fatalf("a malformed Content-Range = %d, want 400", status)
	}
	if status, _ := client.do("GET", "_apis/artifactcache/cache?keys="+strings.Repeat("k,", maxKeys)+"k&version=v1", nil, nil); status != http.StatusBadRequest {
		t.Fatalf("too many keys = %d, want 400", status)
	}
}

// countingReader yields n zero bytes and counts what was read.
type countingReader struct {
	mu       sync.Mutex
	n, count int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.count >= c.n {
		return 0, io.EOF
	}
	k := min(len(p), c.n-c.count)
	clear(p[:k])
	c.count += k
	return k, nil
}

func (c *countingReader) read() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count
}

// headerRecorder is an upstream that records what the proxy forwards.
type headerRecorder struct {
	mu   sync.Mutex
	seen []http.Header
	next http.Handler
}

func (h *headerRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.seen = append(h.seen, r.Header.Clone())
	h.mu.Unlock()
	h.next.ServeHTTP(w, r)
}

func TestProxyForwardsWithoutTheJobsCredentials(t *testing.T) {
	c, _ := newCache(t, Limits{MaxBytes: 1 << 20, MaxEntries: 10, MaxAge: time.Hour})
	scope := mainA
	rec := &headerRecorder{next: scoped(Handler(c, nil), &scope)}
	upstream := httptest.NewTLSServer(rec)
	defer upstream.Close()
	p, err := StartProxy(upstream.URL, upstream.Client().Transport, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !strings.HasPrefix(p.URL, "http://127.0.0.1:") || !strings.HasSuffix(p.URL, "/") || len(p.URL) < len("http://127.0.0.1:1/")+32 {
		t.Fatalf("proxy URL %s: want a loopback URL with a path secret", p.URL)
	}
	client := protocolClient{t: t, url: p.URL, hc: &http.Client{Timeout: 10 * time.Second}}
	if status := client.save("k", "through the proxy"); status/100 != 2 {
		t.Fatalf("save = %d", status)
	}
	if status, got := client.restore("k"); status != 200 || got != "through the proxy" {
		t.Fatalf("restore = %d %q", status, got)
	}
	rec.mu.Lock()
	for _, h := range rec.seen {
		if h.Get("Authorization") != "" {
			t.Errorf("the job's Authorization header reached the gateway")
		}
		if h.Get(HeaderBase) != p.URL {
			t.Errorf("%s = %q, want %q", HeaderBase, h.Get(HeaderBase), p.URL)
		}
	}
	rec.mu.Unlock()
	// Without the path secret, nothing is forwarded.
	u := strings.TrimSuffix(p.URL, "/")
	wrong := u[:strings.LastIndex(u, "/")] + "/" + strings.Repeat("0", 32) + "/"
	before := len(rec.seen)
	res, err := http.Get(wrong + "_apis/artifactcache/cache?keys=k&version=v1")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound || len(rec.seen) != before {
		t.Fatalf("a request without the secret = %d, forwarded %d", res.StatusCode, len(rec.seen)-before)
	}
	// An upstream that is down is a 502, not a hang.
	upstream.Close()
	status, _ := client.do("GET", "_apis/artifactcache/cache?keys=k&version=v1", nil, nil)
	if status != http.StatusBadGateway {
		t.Fatalf("with the gateway down = %d, want 502", status)
	}
}

func TestProxyListenerIsBounded(t *testing.T) {
	p, err := StartProxy("https://127.0.0.1:1", http.DefaultTransport, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.srv.ReadHeaderTimeout <= 0 || p.srv.ReadTimeout <= 0 || p.srv.IdleTimeout <= 0 || p.srv.MaxHeaderBytes <= 0 {
		t.Fatalf("the proxy's server is unbounded: %+v", p.srv)
	}
	if _, err := StartProxy("http://gateway:8443", http.DefaultTransport, nil); err == nil {
		t.Fatal("a plain-http gateway was accepted")
	}
}
