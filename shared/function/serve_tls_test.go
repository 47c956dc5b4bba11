package function_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

// Serve with a TLS configuration terminates TLS over its capped listener,
// so every handler still sees the request's verified peer certificate (the
// gateway authenticates executors by it). A cap wrapped around a TLS
// listener hid it: every executor was refused as unauthenticated.
func TestServeTLSKeepsThePeerCertificate(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	ca, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	serverSVID, err := ca.Mint(spiffeid.RequireFromPath(td, "/gateway"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clientID := spiffeid.RequireFromPath(td, "/repo/alice/app/task/7")
	clientSVID, err := ca.Mint(clientID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv := function.Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "no peer certificate", http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, r.TLS.PeerCertificates[0].URIs[0].String())
	}), 1<<10)
	srv.TLSConfig = tlsconfig.MTLSServerConfig(serverSVID, ca, tlsconfig.AuthorizeMemberOf(td))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- function.Serve(ctx, srv, ln) }()
	defer func() { cancel(); <-served }()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: tlsconfig.MTLSClientConfig(clientSVID, ca, tlsconfig.AuthorizeID(serverSVID.ID))}}
	resp, err := client.Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != clientID.String() {
		t.Fatalf("%d %q; want 200 with the client's SPIFFE ID", resp.StatusCode, body)
	}
}
