// Package svidca is a small SPIFFE certificate authority for places where no
// SPIRE agent can attest a workload: local mode's process executors, and
// OpenSandbox sandboxes. It mints short-lived X.509-SVIDs under one trust
// domain and serves its bundle to verifiers.
//
// The CA's key is the trust anchor: whoever holds it can mint any identity of
// the trust domain. It is created with mode 0600 when persisted.
package svidca

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// rootLifetime is how long a new root is valid.
const rootLifetime = 5 * 365 * 24 * time.Hour

// CA mints X.509-SVIDs. Safe for concurrent use.
type CA struct {
	td   spiffeid.TrustDomain
	key  crypto.Signer
	cert *x509.Certificate
	now  func() time.Time
}

// New creates a CA with a fresh root key for trust domain td.
func New(td spiffeid.TrustDomain) (*CA, error) {
	if td.IsZero() {
		return nil, errors.New("svidca: empty trust domain")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"gitea-dynamic-runner"}, CommonName: td.Name()},
		URIs:                  []*url.URL{td.ID().URL()},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(rootLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("svidca: root certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{td: td, key: key, cert: cert, now: time.Now}, nil
}

// LoadOrCreate reads the CA kept in dir (ca.pem, ca-key.pem), or creates one
// there for td. A CA of another trust domain is an error.
func LoadOrCreate(dir string, td spiffeid.TrustDomain) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	certPEM, err := os.ReadFile(certPath)
	if errors.Is(err, fs.ErrNotExist) {
		ca, err := New(td)
		if err != nil {
			return nil, err
		}
		if err := ca.save(certPath, keyPath); err != nil {
			return nil, err
		}
		return ca, nil
	}
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("svidca: %s or %s is not PEM", certPath, keyPath)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("svidca: %s: %w", certPath, err)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("svidca: %s is not a PKCS#8 key", keyPath)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("svidca: %s is not a signing key", keyPath)
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != td.IDString() {
		return nil, fmt.Errorf("svidca: the CA in %s is not of trust domain %q", dir, td.Name())
	}
	return &CA{td: td, key: signer, cert: cert, now: time.Now}, nil
}

func (c *CA) save(certPath, keyPath string) error {
	if err := os.MkdirAll(filepath.Dir(certPath), 0o700); err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw}), 0o644)
}

// Bundle returns the trust bundle that verifies every SVID the CA mints.
func (c *CA) Bundle() *x509bundle.Bundle {
	return x509bundle.FromX509Authorities(c.td, []*x509.Certificate{c.cert})
}

// GetX509BundleForTrustDomain implements x509bundle.Source.
func (c *CA) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if td != c.td {
		return nil, fmt.Errorf("svidca: no bundle for trust domain %q", td.Name())
	}
	return c.Bundle(), nil
}

// Mint returns a new X.509-SVID for id, valid for ttl (capped at the root's
// own end). id must be in the CA's trust domain.
func (c *CA) Mint(id spiffeid.ID, ttl time.Duration) (*x509svid.SVID, error) {
	if !id.MemberOf(c.td) {
		return nil, fmt.Errorf("svidca: %s is outside trust domain %q", id, c.td.Name())
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("svidca: TTL %v is not positive", ttl)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := c.now()
	notAfter := now.Add(ttl)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		URIs:         []*url.URL{id.URL()},
		NotBefore:    now.Add(-30 * time.Second),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageKeyAgreement,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, key.Public(), c.key)
	if err != nil {
		return nil, fmt.Errorf("svidca: mint %s: %w", id, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &x509svid.SVID{ID: id, Certificates: []*x509.Certificate{leaf}, PrivateKey: key}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}

// MintX509SVID is Mint with the bundle: it makes the CA a
// bootstrap.Minter.
func (c *CA) MintX509SVID(_ context.Context, id spiffeid.ID, ttl time.Duration) (*x509svid.SVID, *x509bundle.Bundle, error) {
	svid, err := c.Mint(id, ttl)
	if err != nil {
		return nil, nil, err
	}
	return svid, c.Bundle(), nil
}
