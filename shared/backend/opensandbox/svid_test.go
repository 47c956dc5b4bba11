package opensandbox_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/spiremint"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/spiremint/spiremintest"
)

// testMinter is a CA of its own trust domain that mints SVIDs.
type testMinter struct {
	t      *testing.T
	ca     *x509.Certificate
	caKey  crypto.Signer
	bundle *x509bundle.Bundle
	// forID, if set, replaces the SPIFFE ID asked for; err fails minting.
	forID *spiffeid.ID
	err   error

	mu   sync.Mutex
	ttls []time.Duration
}

func newTestMinter(t *testing.T, trust spiffeid.TrustDomain) *testMinter {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		URIs: []*url.URL{trust.ID().URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testMinter{t: t, ca: ca, caKey: key, bundle: x509bundle.FromX509Authorities(trust, []*x509.Certificate{ca})}
}

func (m *testMinter) MintX509SVID(_ context.Context, id spiffeid.ID, ttl time.Duration) (*x509svid.SVID, *x509bundle.Bundle, error) {
	m.mu.Lock()
	m.ttls = append(m.ttls, ttl)
	m.mu.Unlock()
	if m.err != nil {
		return nil, nil, m.err
	}
	if m.forID != nil {
		id = *m.forID
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(ttl),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs: []*url.URL{id.URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, m.ca, key.Public(), m.caKey)
	if err != nil {
		return nil, nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return &x509svid.SVID{ID: id, Certificates: []*x509.Certificate{leaf}, PrivateKey: key}, m.bundle, nil
}

func TestCreateHandsTheSandboxAMintedSVID(t *testing.T) {
	minter := newTestMinter(t, td)
	h := newHarness(t, func(c *opensandbox.Config) { c.Minter = minter })
	a := assignment(t, "linux", 42)
	e := h.create(t, a)
	sb, _ := h.fake.Sandbox(e.Name)

	svid, err := x509svid.Parse([]byte(sb.Env[bootstrap.EnvSVIDCert]), []byte(sb.Env[bootstrap.EnvSVIDKey]))
	if err != nil {
		t.Fatalf("the sandbox's SVID does not parse: %v", err)
	}
	if svid.ID.String() != a.Identity.SPIFFEID {
		t.Fatalf("SVID for %s, want %s", svid.ID, a.Identity.SPIFFEID)
	}
	block, _ := pem.Decode([]byte(sb.Env[bootstrap.EnvSVIDBundle]))
	if block == nil || !bytes.Equal(block.Bytes, minter.ca.Raw) {
		t.Fatal("the bundle is not the minter's CA")
	}
	if _, _, err := x509svid.Verify(svid.Certificates, minter.bundle); err != nil {
		t.Fatalf("the SVID does not verify against the bundle: %v", err)
	}
	if len(minter.ttls) != 1 || minter.ttls[0] != 90*time.Minute {
		t.Fatalf("minted with TTLs %v, want the pool's job timeout", minter.ttls)
	}
	annotations, err := opensandbox.DecodeAnnotations(prefix, sb.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range annotations {
		if strings.Contains(v, "PRIVATE KEY") || strings.Contains(v, "CERTIFICATE") {
			t.Fatalf("annotation %s holds SVID material", k)
		}
	}
	// The environment is the executor's plus the SVID's and the profile's.
	if len(sb.Env) != len(h.launch(t, a).Environment)+len(bootstrap.SVIDVariables())+1 {
		t.Fatalf("env has %d variables", len(sb.Env))
	}
	if err := h.backend.BindIdentity(context.Background(), e, a.Identity); err != nil {
		t.Fatal(err)
	}
}

func TestCreateRefusesABadSVID(t *testing.T) {
	mallory := spiffeid.RequireFromString("spiffe://ci.example.org/repo/mallory/x/task/42")
	tests := []struct {
		name    string
		minter  func(t *testing.T) *testMinter
		wantErr string
	}{
		{"minting fails", func(t *testing.T) *testMinter {
			m := newTestMinter(t, td)
			m.err = errors.New("SPIRE server unreachable")
			return m
		}, "unreachable"},
		{"an SVID for another ID", func(t *testing.T) *testMinter {
			m := newTestMinter(t, td)
			m.forID = &mallory
			return m
		}, "mallory"},
		{"a bundle of another trust domain", func(t *testing.T) *testMinter {
			return newTestMinter(t, spiffeid.RequireTrustDomainFromString("other.example.org"))
		}, "bundle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.minter(t)
			h := newHarness(t, func(c *opensandbox.Config) { c.Minter = m })
			a := assignment(t, "linux", 42)
			_, err := h.backend.Create(context.Background(), a, h.launch(t, a))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), a.ID) {
				t.Fatalf("err = %v, want one naming %s and the assignment", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), "CERTIFICATE") {
				t.Fatalf("the error holds PEM: %v", err)
			}
			if h.fake.Creates() != 0 {
				t.Fatal("a sandbox was created")
			}
			if executor.IsPermanent(err) {
				t.Fatalf("err = %v is permanent; the next delivery mints again", err)
			}
		})
	}
}

// TestCreateWithSPIRE: the backend consumes a SPIRE minter like any other:
// the sandbox gets SPIRE's SVID for the task, for the pool's job timeout;
// a SPIRE Server that refuses handle, or is unreachable, fails the create
// transiently with a message saying so, and creates no sandbox.
func TestCreateWithSPIRE(t *testing.T) {
	spire := spiremintest.New(t, td)
	h := newHarness(t, func(c *opensandbox.Config) { c.Minter = spiremint.New(spire.Conn()) })
	a := assignment(t, "linux", 42)
	e := h.create(t, a)
	sb, _ := h.fake.Sandbox(e.Name)
	svid, err := x509svid.Parse([]byte(sb.Env[bootstrap.EnvSVIDCert]), []byte(sb.Env[bootstrap.EnvSVIDKey]))
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID.String() != a.Identity.SPIFFEID {
		t.Fatalf("SVID for %s", svid.ID)
	}
	if err := svid.Certificates[0].CheckSignatureFrom(spire.CA); err != nil {
		t.Fatalf("the SVID is not SPIRE's: %v", err)
	}
	if calls := spire.Calls(); len(calls) != 1 || calls[0].TTL != 90*time.Minute || calls[0].ID.String() != a.Identity.SPIFFEID {
		t.Fatalf("SPIRE was asked %+v", calls)
	}

	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"refused", status.Error(codes.PermissionDenied, "authorization denied for MintX509SVID"), "refused this caller"},
		{"unreachable", status.Error(codes.Unavailable, "connection refused"), "unreachable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spire := spiremintest.New(t, td)
			spire.SetFaults(spiremintest.Faults{MintErr: tt.err})
			h := newHarness(t, func(c *opensandbox.Config) { c.Minter = spiremint.New(spire.Conn()) })
			a := assignment(t, "linux", 43)
			_, err := h.backend.Create(context.Background(), a, h.launch(t, a))
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), a.ID) || !strings.Contains(err.Error(), a.Identity.SPIFFEID) {
				t.Fatalf("err = %v, want one naming the assignment, the identity and %q", err, tt.want)
			}
			if executor.IsPermanent(err) {
				t.Fatalf("err = %v is permanent", err)
			}
			if h.fake.Creates() != 0 {
				t.Fatal("a sandbox was created")
			}
		})
	}
}
