package gateway

import (
	"context"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// Credentials are what an executor proves itself with.
type Credentials struct {
	SVID         x509svid.Source
	Bundle       x509bundle.Source
	AssignmentID string
	Capability   string
}

// NewClient returns a runner-protocol client to the gateway at url (its base,
// such as https://gateway:8443) for the executor holding creds. server
// authorizes the gateway's own SVID (tlsconfig.AuthorizeMemberOf(td), or
// AuthorizeID of a known gateway ID).
func NewClient(url string, creds Credentials, server tlsconfig.Authorizer) runnerv1connect.RunnerServiceClient {
	hc := &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:     tlsconfig.MTLSClientConfig(creds.SVID, creds.Bundle, server),
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     90 * time.Second,
		},
	}
	headers := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set(HeaderAssignment, creds.AssignmentID)
			req.Header().Set(HeaderCapability, creds.Capability)
			return next(ctx, req)
		}
	})
	return runnerv1connect.NewRunnerServiceClient(hc, url, connect.WithInterceptors(headers))
}

// NewTransport returns an HTTP transport to the gateway for the executor
// holding creds: its SVID at the handshake (server authorizes the gateway's,
// as for NewClient) and its capability headers on every request. The cache
// proxy (actionscache.Proxy) forwards a job's cache calls through it; it
// sets no overall timeout, so that large archives stream.
func NewTransport(creds Credentials, server tlsconfig.Authorizer) http.RoundTripper {
	return capabilityTransport{creds: creds, next: &http.Transport{
		TLSClientConfig:       tlsconfig.MTLSClientConfig(creds.SVID, creds.Bundle, server),
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute,
	}}
}

type capabilityTransport struct {
	creds Credentials
	next  http.RoundTripper
}

func (t capabilityTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(HeaderAssignment, t.creds.AssignmentID)
	req.Header.Set(HeaderCapability, t.creds.Capability)
	return t.next.RoundTrip(req)
}
