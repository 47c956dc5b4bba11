package actionscache

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"golang.org/x/net/netutil"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/writeprogress"
)

// Proxy bounds, those of the functions' servers (shared/function; the write
// progress bound is shared/writeprogress): a request's headers; a whole request
// (one chunk of at most MaxChunkBytes relayed to the gateway); an idle
// connection; each write of a response (an archive streams for as long as
// the job reads it, but a job that stops reading loses its connection this
// long after the write it left blocked); the connections held at once (past
// it, new ones wait in the kernel's backlog).
const (
	proxyHeaderTimeout  = 10 * time.Second
	proxyReadTimeout    = 10 * time.Minute
	proxyIdleTimeout    = time.Minute
	proxyWriteProgress  = 30 * time.Second
	proxyMaxConnections = 512
)

// Proxy is the cache endpoint the runner serves inside its executor, on
// 127.0.0.1 at a random port and a random path secret (processes of other
// jobs on the same host, local mode's, cannot guess it). It forwards each
// call to the cache under upstream (the gateway) over transport, which
// authenticates the executor (its SVID and capability): the job gets no
// credential, and its own Authorization header (the Gitea runtime token
// @actions/cache sends) never leaves the executor.
type Proxy struct {
	// URL is the ACTIONS_CACHE_URL to give the job: http://127.0.0.1:<port>/<secret>/.
	URL string

	srv *http.Server
	ln  net.Listener
}

// StartProxy serves a Proxy forwarding to upstream (the gateway's base URL,
// such as https://gateway:8443) until Close.
func StartProxy(upstream string, transport http.RoundTripper, log *slog.Logger) (*Proxy, error) {
	return startProxy(upstream, transport, log, proxyWriteProgress, proxyMaxConnections)
}

func startProxy(upstream string, transport http.RoundTripper, log *slog.Logger, progress time.Duration, maxConns int) (*Proxy, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	target, err := url.Parse(strings.TrimSuffix(upstream, "/"))
	if err != nil || target.Scheme != "https" || target.Host == "" {
		return nil, errors.New("cache proxy: the gateway URL is not https")
	}
	var secret [16]byte
	if _, err := io.ReadFull(rand.Reader, secret[:]); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cache proxy: %w", err)
	}
	prefix := "/" + hex.EncodeToString(secret[:]) + "/"
	p := &Proxy{URL: "http://" + ln.Addr().String() + prefix, ln: ln}
	rp := &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
			pr.Out.URL.Path = target.Path + "/" + strings.TrimPrefix(pr.In.URL.Path, prefix)
			pr.Out.URL.RawPath = ""
			pr.Out.Host = ""
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Cookie")
			pr.Out.Header.Set(HeaderBase, p.URL)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("cache call failed", slog.String("method", r.Method), slog.Any("error", err))
			writeError(w, http.StatusBadGateway, errors.New("the cache service is unreachable"))
		},
	}
	mux := http.NewServeMux()
	mux.Handle(prefix+strings.TrimPrefix(PathPrefix, "/"), rp)
	p.srv = &http.Server{
		Handler:           http.MaxBytesHandler(writeprogress.Handler(mux, progress), MaxChunkBytes),
		ReadHeaderTimeout: proxyHeaderTimeout,
		ReadTimeout:       proxyReadTimeout,
		IdleTimeout:       proxyIdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
	go func() { _ = p.srv.Serve(netutil.LimitListener(ln, maxConns)) }()
	return p, nil
}

// Close stops the proxy.
func (p *Proxy) Close() error { return p.srv.Close() }
