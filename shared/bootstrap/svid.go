package bootstrap

import (
	"context"
	"encoding/pem"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// Minter mints X.509-SVIDs for executors no SPIRE agent can attest (local
// processes, sandboxes): svidca.CA, or a SPIRE Server's SVID API.
type Minter interface {
	// MintX509SVID returns a new X.509-SVID for id that expires after at
	// most ttl, and the bundle of id's trust domain.
	MintX509SVID(ctx context.Context, id spiffeid.ID, ttl time.Duration) (*x509svid.SVID, *x509bundle.Bundle, error)
}

// SVIDVariables lists the variables SVIDEnvironment sets.
func SVIDVariables() []string { return []string{EnvSVIDCert, EnvSVIDKey, EnvSVIDBundle} }

// SVIDEnvironment mints an SVID for id valid for ttl and returns the
// executor variables that hand it over (EnvSVIDCert, EnvSVIDKey,
// EnvSVIDBundle, PEM). It is the one place an SVID becomes variables. The
// SVID must be exactly id's, with a chain and a key, and the bundle must be
// of id's trust domain with at least one authority. Its errors name the
// identity, never key material.
func SVIDEnvironment(ctx context.Context, m Minter, id spiffeid.ID, ttl time.Duration) (map[string]string, error) {
	svid, bundle, err := m.MintX509SVID(ctx, id, ttl)
	if err != nil {
		return nil, fmt.Errorf("mint an X.509-SVID for %s: %w", id, err)
	}
	if svid == nil || bundle == nil {
		return nil, fmt.Errorf("mint an X.509-SVID for %s: the minter returned no SVID or no bundle", id)
	}
	if svid.ID != id {
		return nil, fmt.Errorf("mint an X.509-SVID for %s: the minter returned one for %s", id, svid.ID)
	}
	if bundle.TrustDomain() != id.TrustDomain() || len(bundle.X509Authorities()) == 0 {
		return nil, fmt.Errorf("mint an X.509-SVID for %s: the bundle is not of trust domain %s or has no authority", id, id.TrustDomain())
	}
	certs, key, err := svid.Marshal()
	if err != nil {
		// x509svid's errors name what is wrong, never the key material.
		return nil, fmt.Errorf("mint an X.509-SVID for %s: %w", id, err)
	}
	var authorities []byte
	for _, c := range bundle.X509Authorities() {
		authorities = append(authorities, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return map[string]string{
		EnvSVIDCert:   string(certs),
		EnvSVIDKey:    string(key),
		EnvSVIDBundle: string(authorities),
	}, nil
}
