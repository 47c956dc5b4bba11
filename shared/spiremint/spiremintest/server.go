// Package spiremintest is a fake SPIRE Server SVID and Bundle API for
// tests: it serves MintX509SVID and GetBundle on a unix socket, checks
// every request the way SPIRE v1.13.3 does (a CSR with a valid signature
// and exactly one URI SAN in its trust domain), records what it was asked,
// and can be told to fail or to answer wrongly.
package spiremintest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	bundlev1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/bundle/v1"
	svidv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/svid/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Request is one MintX509SVID call as the fake saw it.
type Request struct {
	// ID is the CSR's one URI SAN.
	ID spiffeid.ID
	// TTL is the TTL asked for.
	TTL time.Duration
	// PublicKey is the CSR's public key; its signature was checked.
	PublicKey crypto.PublicKey
}

// Server is the fake. Set its fields before the calls they should affect;
// they are read under its lock.
type Server struct {
	// Socket is the unix socket it serves on.
	Socket string
	// CA signs the SVIDs; Bundle holds it.
	CA *x509.Certificate
	td spiffeid.TrustDomain

	mu     sync.Mutex
	caKey  crypto.Signer
	conn   *grpc.ClientConn
	calls  []Request
	faults Faults
}

// Faults make the fake misbehave; the zero value behaves.
type Faults struct {
	// MintErr and BundleErr fail the RPC with that status.
	MintErr, BundleErr error
	// ForID mints for this ID instead of the CSR's.
	ForID spiffeid.ID
	// ExtraTTL lengthens every SVID beyond what was asked.
	ExtraTTL time.Duration
	// OtherKey certifies a fresh key instead of the CSR's.
	OtherKey bool
	// BundleTrustDomain names another trust domain in the bundle.
	BundleTrustDomain string
	// OtherBundle serves a bundle of another CA.
	OtherBundle bool
}

// New starts a fake for trust domain td; it stops when the test ends.
func New(t testing.TB, td spiffeid.TrustDomain) *Server {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := selfSigned(t, td, key)
	dir, err := os.MkdirTemp("", "gdr-spiremint-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &Server{Socket: filepath.Join(dir, "api.sock"), CA: ca, caKey: key, td: td}
	ln, err := net.Listen("unix", s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svidv1.RegisterSVIDServer(g, svidServer{s: s})
	bundlev1.RegisterBundleServer(g, bundleServer{s: s})
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	s.conn, err = grpc.NewClient("unix://"+s.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.conn.Close() })
	return s
}

func selfSigned(t testing.TB, td spiffeid.TrustDomain, key crypto.Signer) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake SPIRE CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs: []*url.URL{td.ID().URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Conn is a client connection to the fake, closed when the test ends.
func (s *Server) Conn() *grpc.ClientConn { return s.conn }

// SetFaults replaces the faults.
func (s *Server) SetFaults(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
}

// Calls returns the MintX509SVID requests that passed SPIRE's checks.
func (s *Server) Calls() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.calls...)
}

type svidServer struct {
	svidv1.UnimplementedSVIDServer
	s *Server
}

func (v svidServer) MintX509SVID(_ context.Context, req *svidv1.MintX509SVIDRequest) (*svidv1.MintX509SVIDResponse, error) {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.faults.MintErr != nil {
		return nil, s.faults.MintErr
	}
	csr, err := x509.ParseCertificateRequest(req.GetCsr())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "malformed CSR")
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, status.Error(codes.InvalidArgument, "failed to verify CSR signature")
	}
	if len(csr.URIs) != 1 {
		return nil, status.Error(codes.InvalidArgument, "exactly one URI SAN is expected")
	}
	id, err := spiffeid.FromURI(csr.URIs[0])
	if err != nil || !id.MemberOf(s.td) {
		return nil, status.Error(codes.InvalidArgument, "CSR URI SAN is invalid")
	}
	ttl := time.Duration(req.GetTtl()) * time.Second
	s.calls = append(s.calls, Request{ID: id, TTL: ttl, PublicKey: csr.PublicKey})
	if !s.faults.ForID.IsZero() {
		id = s.faults.ForID
	}
	pub := csr.PublicKey
	if s.faults.OtherKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		pub = k.Public()
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), NotBefore: now.Add(-10 * time.Second), NotAfter: now.Add(ttl + s.faults.ExtraTTL),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageKeyAgreement,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{id.URL()}, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.CA, pub, s.caKey)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &svidv1.MintX509SVIDResponse{Svid: &types.X509SVID{
		Id:        &types.SPIFFEID{TrustDomain: id.TrustDomain().Name(), Path: id.Path()},
		CertChain: [][]byte{der}, ExpiresAt: tmpl.NotAfter.Unix(),
	}}, nil
}

type bundleServer struct {
	bundlev1.UnimplementedBundleServer
	s *Server
}

func (b bundleServer) GetBundle(context.Context, *bundlev1.GetBundleRequest) (*types.Bundle, error) {
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.faults.BundleErr != nil {
		return nil, s.faults.BundleErr
	}
	td, ca := s.td.Name(), s.CA.Raw
	if s.faults.BundleTrustDomain != "" {
		td = s.faults.BundleTrustDomain
	}
	if s.faults.OtherBundle {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, URIs: []*url.URL{s.td.ID().URL()}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		ca = der
	}
	return &types.Bundle{TrustDomain: td, X509Authorities: []*types.X509Certificate{{Asn1: ca}}}, nil
}
