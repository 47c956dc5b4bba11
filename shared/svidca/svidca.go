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
	"sync"
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
	// authorities are bundle.pem's (nil: the CA's certificate alone).
	authorities []*x509.Certificate
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

// The files of a CA's folder.
const (
	certFile = "ca.pem"
	keyFile  = "ca-key.pem"
	// BundleFile, optional, lists every authority the CA's SVIDs are verified with, its own
	// certificate among them: during a rotation, the old root and the new (an SVID or a
	// gateway certificate signed by either stays valid until it expires).
	BundleFile = "bundle.pem"
)

// LoadOrCreate reads the CA kept in dir (ca.pem, ca-key.pem), or creates one
// there for td. A CA of another trust domain is an error.
func LoadOrCreate(dir string, td spiffeid.TrustDomain) (*CA, error) {
	ca, err := Load(dir, td)
	if !errors.Is(err, fs.ErrNotExist) {
		return ca, err
	}
	if ca, err = New(td); err != nil {
		return nil, err
	}
	if err := ca.save(filepath.Join(dir, certFile), filepath.Join(dir, keyFile)); err != nil {
		return nil, err
	}
	return ca, nil
}

// Load reads the CA kept in dir (ca.pem, ca-key.pem; an error wrapping
// fs.ErrNotExist when ca.pem is absent) and, when dir has one, bundle.pem,
// which must hold the CA's own certificate. It writes nothing: dir may be a
// read-only Secret volume.
func Load(dir string, td spiffeid.TrustDomain) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, certFile), filepath.Join(dir, keyFile)
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("svidca: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("svidca: %w", err)
	}
	ca, err := Parse(certPEM, keyPEM, td)
	if err != nil {
		return nil, fmt.Errorf("svidca: %s, %s: %w", certPath, keyPath, err)
	}
	switch b, err := x509bundle.Load(td, filepath.Join(dir, BundleFile)); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("svidca: %w", err)
	case !b.HasX509Authority(ca.cert):
		return nil, fmt.Errorf("svidca: %s does not hold the CA's own certificate (%s)", filepath.Join(dir, BundleFile), certPath)
	default:
		ca.authorities = b.X509Authorities()
	}
	return ca, nil
}

// Parse returns the CA of a PEM certificate and PKCS#8 key (Marshal's), which must be of
// trust domain td. Its errors never hold key material.
func Parse(certPEM, keyPEM []byte, td spiffeid.TrustDomain) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("the certificate or the key is not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the certificate: %w", err)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, errors.New("the key is not PKCS#8")
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("the key is not a signing key")
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != td.IDString() {
		return nil, fmt.Errorf("the CA is not of trust domain %q", td.Name())
	}
	if !cert.IsCA {
		return nil, errors.New("the certificate is not a CA's")
	}
	return &CA{td: td, key: signer, cert: cert, now: time.Now}, nil
}

// Marshal returns the CA's certificate and its PKCS#8 key, PEM (Parse reads them).
func (c *CA) Marshal() (certPEM, keyPEM []byte, err error) {
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// Certificate is the CA's own certificate, its root.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

func (c *CA) save(certPath, keyPath string) error {
	if err := os.MkdirAll(filepath.Dir(certPath), 0o700); err != nil {
		return err
	}
	certPEM, keyPEM, err := c.Marshal()
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(certPath, certPEM, 0o644)
}

// Bundle returns the trust bundle that verifies every SVID the CA mints:
// bundle.pem's authorities where the CA's folder has one.
func (c *CA) Bundle() *x509bundle.Bundle {
	if c.authorities != nil {
		return x509bundle.FromX509Authorities(c.td, c.authorities)
	}
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

// Deferred is the CA of a folder loaded on its first mint (Load), and
// again after a failed load: a process that may never mint (recover beside
// handle, in the same configuration) neither needs nor reads the key. Safe
// for concurrent use.
type Deferred struct {
	dir string
	td  spiffeid.TrustDomain

	mu sync.Mutex
	ca *CA
}

// NewDeferred returns the CA of dir for td, loaded on its first mint.
func NewDeferred(dir string, td spiffeid.TrustDomain) *Deferred {
	return &Deferred{dir: dir, td: td}
}

// MintX509SVID loads the CA if it is not yet, then mints as CA.MintX509SVID.
func (d *Deferred) MintX509SVID(ctx context.Context, id spiffeid.ID, ttl time.Duration) (*x509svid.SVID, *x509bundle.Bundle, error) {
	d.mu.Lock()
	if d.ca == nil {
		ca, err := Load(d.dir, d.td)
		if err != nil {
			d.mu.Unlock()
			return nil, nil, err
		}
		d.ca = ca
	}
	ca := d.ca
	d.mu.Unlock()
	return ca.MintX509SVID(ctx, id, ttl)
}
