// Package spiremint mints X.509-SVIDs with a SPIRE Server's SVID API, for
// executors no SPIRE agent can attest (OpenSandbox sandboxes in a cluster),
// so that they chain to the same bundle the gateway trusts.
//
// A Minter generates the private key itself, sends SPIRE only a CSR
// (MintX509SVID), reads the trust domain's bundle (GetBundle) and checks
// the answer before handing it out: the SVID is exactly the identity asked
// for, holds the key generated here, chains to the bundle and ends no later
// than the TTL asked for. The key never leaves the process but in the SVID
// returned; errors name the identity and the RPC, never key material.
//
// Every failure is transient for the caller (see Minter.MintX509SVID): an
// unreachable server or a refused caller is fixed by an operator or by
// time, and the assignment comes back.
package spiremint

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	bundlev1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/bundle/v1"
	svidv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/svid/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// clockSkew is how much later than now+ttl an SVID may end and still be
// accepted: the server's clock and ours differ a little.
const clockSkew = time.Minute

// Minter mints X.509-SVIDs through a SPIRE Server. It implements
// bootstrap.Minter. It holds no state of its own and is safe for
// concurrent use.
type Minter struct {
	svids   svidv1.SVIDClient
	bundles bundlev1.BundleClient
	now     func() time.Time
}

// New returns a Minter over conn, a connection to the SPIRE Server API on
// which the caller is allowed MintX509SVID (an admin ID, or a local unix
// socket caller; GetBundle is open to any caller). The caller owns conn.
func New(conn grpc.ClientConnInterface) *Minter {
	return &Minter{svids: svidv1.NewSVIDClient(conn), bundles: bundlev1.NewBundleClient(conn), now: time.Now}
}

// MintX509SVID returns a new X.509-SVID for id that ends after at most ttl
// (whole seconds, at least one; SPIRE may end it earlier, at its CA's end),
// and the bundle of id's trust domain as the SPIRE Server serves it.
//
// The key is a fresh ECDSA P-256 key generated here; SPIRE sees only the
// CSR, whose one URI SAN is id. Nothing is retried: a failure leaves no
// state behind (an SVID minted and then refused here is simply dropped, it
// was never handed out), so the caller's retry mints afresh.
func (m *Minter) MintX509SVID(ctx context.Context, id spiffeid.ID, ttl time.Duration) (*x509svid.SVID, *x509bundle.Bundle, error) {
	if id.IsZero() {
		return nil, nil, errors.New("spiremint: no SPIFFE ID to mint")
	}
	seconds := ttl / time.Second
	if seconds < 1 || seconds > 1<<31-1 {
		return nil, nil, fmt.Errorf("spiremint: mint %s: TTL %v is not between 1s and 2^31-1s", id, ttl)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("spiremint: mint %s: generate a key: %w", id, err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{id.URL()}}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("spiremint: mint %s: CSR: %w", id, err)
	}
	start := m.now()
	resp, err := m.svids.MintX509SVID(ctx, &svidv1.MintX509SVIDRequest{Csr: csr, Ttl: int32(seconds)})
	if err != nil {
		return nil, nil, rpcError("MintX509SVID", id, err)
	}
	svid, err := m.parse(id, key, resp)
	if err != nil {
		return nil, nil, err
	}
	if end, limit := svid.Certificates[0].NotAfter, start.Add(seconds*time.Second+clockSkew); end.After(limit) {
		return nil, nil, fmt.Errorf("spiremint: mint %s: SPIRE's SVID ends at %s, after the %v asked for", id, end.UTC().Format(time.RFC3339), seconds*time.Second)
	}
	bundle, err := m.bundle(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if _, _, err := x509svid.Verify(svid.Certificates, bundle); err != nil {
		return nil, nil, fmt.Errorf("spiremint: mint %s: SPIRE's SVID does not chain to its own bundle: %w", id, err)
	}
	return svid, bundle, nil
}

// parse turns SPIRE's answer into an SVID holding key, and checks it is
// exactly id's.
func (m *Minter) parse(id spiffeid.ID, key *ecdsa.PrivateKey, resp *svidv1.MintX509SVIDResponse) (*x509svid.SVID, error) {
	chain := resp.GetSvid().GetCertChain()
	if len(chain) == 0 {
		return nil, fmt.Errorf("spiremint: mint %s: SPIRE answered no certificate", id)
	}
	var der []byte
	for _, c := range chain {
		der = append(der, c...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("spiremint: mint %s: %w", id, err)
	}
	// ParseRaw checks that the leaf is an SVID (one SPIFFE ID, not a CA,
	// digital signature) and that it holds key's public half.
	svid, err := x509svid.ParseRaw(der, keyDER)
	if err != nil {
		return nil, fmt.Errorf("spiremint: mint %s: SPIRE's answer is not an SVID for the key sent: %w", id, err)
	}
	if svid.ID != id {
		return nil, fmt.Errorf("spiremint: mint %s: SPIRE minted one for %s", id, svid.ID)
	}
	return svid, nil
}

// bundle reads the X.509 authorities of id's trust domain from the server.
func (m *Minter) bundle(ctx context.Context, id spiffeid.ID) (*x509bundle.Bundle, error) {
	b, err := m.bundles.GetBundle(ctx, &bundlev1.GetBundleRequest{})
	if err != nil {
		return nil, rpcError("GetBundle", id, err)
	}
	if b.GetTrustDomain() != id.TrustDomain().Name() {
		return nil, fmt.Errorf("spiremint: mint %s: the SPIRE Server's bundle is of trust domain %q", id, b.GetTrustDomain())
	}
	var authorities []*x509.Certificate
	for _, a := range b.GetX509Authorities() {
		c, err := x509.ParseCertificate(a.GetAsn1())
		if err != nil {
			return nil, fmt.Errorf("spiremint: mint %s: the SPIRE Server's bundle: %w", id, err)
		}
		authorities = append(authorities, c)
	}
	if len(authorities) == 0 {
		return nil, fmt.Errorf("spiremint: mint %s: the SPIRE Server's bundle has no X.509 authority", id)
	}
	return x509bundle.FromX509Authorities(id.TrustDomain(), authorities), nil
}

// rpcError words a failed call to the SPIRE Server so an operator knows
// what to fix. It wraps err (its gRPC status stays readable with
// status.Code) and is never executor.Permanent.
func rpcError(method string, id spiffeid.ID, err error) error {
	var why string
	switch status.Code(err) {
	case codes.Unavailable:
		why = "the SPIRE Server is unreachable"
	case codes.DeadlineExceeded, codes.Canceled:
		why = "no answer from the SPIRE Server in time"
	case codes.PermissionDenied, codes.Unauthenticated:
		why = "the SPIRE Server refused this caller (it needs an admin SPIFFE ID, server admin_ids, or the local admin socket)"
	default:
		why = "the SPIRE Server failed"
	}
	return fmt.Errorf("spiremint: %s for %s: %s: %w", method, id, why, err)
}
