//go:build e2e

package opensandbox_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	bundlev1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/bundle/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gateway"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/spiremint"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// TestE2EOpenSandboxSVIDFromSPIRE runs the opensandbox backend, as handle
// builds it, against a real spire-server: the sandbox's SVID, read from its
// environment as the runner reads it, is the task's, chains to SPIRE's own
// bundle, and completes a SPIFFE mTLS handshake with a gateway whose SVID
// SPIRE issued, both sides using the authorizers the gateway and the runner
// use. An SVID of the local CA (what a sandbox got before) fails that
// handshake at the gateway.
func TestE2EOpenSandboxSVIDFromSPIRE(t *testing.T) {
	spire := spireenv.Start(t)
	if spire.TrustDomain != td {
		t.Fatalf("spireenv serves %s, the test expects %s", spire.TrustDomain, td)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sandboxes := sandboxapitest.New(t, sandboxapitest.WithAPIKey("k"))
	d := deps(t)
	b, release, err := opensandbox.Build(backend.BuildSettings{OpenSandboxSettings: backend.OpenSandboxSettings{
		OpenSandboxURL: sandboxes.URL, OpenSandboxKey: "k", OpenSandboxSPIRE: "unix:" + spire.Socket,
	}}, d)
	if err != nil {
		t.Fatal(err)
	}
	defer release()

	identity, err := taskidentity.New(td, "alice/repo", "build", 7)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendOpenSandbox, taskassignment.Task{ID: 7, Pool: "sandbox"}, identity)
	if err != nil {
		t.Fatal(err)
	}
	gatewayID := spiffeid.RequireFromPath(td, "/gateway")
	boot, err := bootstrap.New(bytes.Repeat([]byte{1}, 32), "https://gateway.example.org", gatewayID)
	if err != nil {
		t.Fatal(err)
	}
	env, err := boot.Environment(a)
	if err != nil {
		t.Fatal(err)
	}
	minted := time.Now()
	e, err := b.Create(ctx, a, executor.LaunchSpec{Metadata: d.Keys.Metadata(a), Environment: env})
	if err != nil {
		t.Fatal(err)
	}
	sb, ok := sandboxes.Sandbox(e.Name)
	if !ok {
		t.Fatal("no sandbox")
	}

	// As the runner reads it (shared/runner identity).
	taskID := spiffeid.RequireFromString(identity.SPIFFEID)
	svid, err := x509svid.Parse([]byte(sb.Env[bootstrap.EnvSVIDCert]), []byte(sb.Env[bootstrap.EnvSVIDKey]))
	if err != nil {
		t.Fatal(err)
	}
	handed, err := x509bundle.Parse(td, []byte(sb.Env[bootstrap.EnvSVIDBundle]))
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID != taskID {
		t.Fatalf("SVID for %s, want %s", svid.ID, taskID)
	}
	// The pool's job timeout is 45m: SPIRE's SVID ends no later.
	if end := svid.Certificates[0].NotAfter; end.After(minted.Add(46*time.Minute)) || end.Before(minted.Add(40*time.Minute)) {
		t.Fatalf("the SVID ends at %v, not about 45m after %v", end, minted)
	}
	// SPIRE's bundle, read on its own, verifies it and is the one handed over.
	got, err := bundlev1.NewBundleClient(spire.Conn()).GetBundle(ctx, &bundlev1.GetBundleRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var spireCAs [][]byte
	for _, c := range got.GetX509Authorities() {
		spireCAs = append(spireCAs, c.GetAsn1())
	}
	if len(spireCAs) == 0 || len(handed.X509Authorities()) != len(spireCAs) {
		t.Fatalf("handed over %d authorities, SPIRE has %d", len(handed.X509Authorities()), len(spireCAs))
	}
	for i, c := range handed.X509Authorities() {
		if !bytes.Equal(c.Raw, spireCAs[i]) {
			t.Fatal("the bundle handed over is not SPIRE's")
		}
	}
	if id, _, err := x509svid.Verify(svid.Certificates, handed); err != nil || id != taskID {
		t.Fatalf("the SVID does not verify against SPIRE's bundle: %v %v", id, err)
	}

	// The gateway's SVID, as SPIRE issues it (an agent would; the same CA).
	gatewaySVID, gatewayBundle, err := spiremint.New(spire.Conn()).MintX509SVID(ctx, gatewayID, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	gw := &gateway.Gateway{TrustDomain: td}
	if err := handshake(t, tlsconfig.MTLSServerConfig(gatewaySVID, gatewayBundle, gw.Authorizer()),
		tlsconfig.MTLSClientConfig(svid, handed, tlsconfig.AuthorizeID(gatewayID)), taskID); err != nil {
		t.Fatalf("the handshake with SPIRE's SVID failed: %v", err)
	}

	// The bug this fixes: an SVID of the local CA (GDR_CA_DIR), even with
	// a client that trusts the gateway, is refused by the gateway.
	ca, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	local, err := ca.Mint(taskID, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	err = handshake(t, tlsconfig.MTLSServerConfig(gatewaySVID, gatewayBundle, gw.Authorizer()),
		tlsconfig.MTLSClientConfig(local, handed, tlsconfig.AuthorizeID(gatewayID)), taskID)
	if err == nil || !strings.Contains(err.Error(), "server:") {
		t.Fatalf("the gateway accepted a local-CA SVID, or refused it for another reason: %v", err)
	}
	t.Logf("local CA SVID refused as expected: %v", err)
}

// handshake runs one TLS handshake between server and client on 127.0.0.1
// and returns the server's error (prefixed "server:") or the client's. On
// success it checks the server saw want.
func handshake(t *testing.T, server, client *tls.Config, want spiffeid.ID) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		peer spiffeid.ID
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			done <- result{err: err}
			return
		}
		id, err := x509svid.IDFromCert(tc.ConnectionState().PeerCertificates[0])
		done <- result{peer: id, err: err}
	}()
	conn, err := net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tc := tls.Client(conn, client)
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	cerr := tc.Handshake()
	if cerr == nil {
		// TLS 1.3: the server's verdict on the client certificate arrives
		// with the first read.
		_, cerr = tc.Read(make([]byte, 1))
		if errors.Is(cerr, net.ErrClosed) || cerr != nil && strings.Contains(cerr.Error(), "EOF") {
			cerr = nil
		}
	}
	r := <-done
	if r.err != nil {
		return errors.New("server: " + r.err.Error())
	}
	if cerr != nil {
		return cerr
	}
	if r.peer != want {
		t.Fatalf("the server saw %s, want %s", r.peer, want)
	}
	return nil
}
