package opensandboxbackend

import (
	"context"
	"encoding/pem"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
)

// The variables a sandbox gets its minted X.509-SVID in, PEM-encoded, when
// the backend has a Minter. No SPIRE agent can attest a sandbox, so this is
// how its runner gets the identity the gateway authenticates. Like every
// executor variable they are credentials: never in metadata, logs, events or
// errors.
// They are the runner's bootstrap variables for a handed-over SVID.
const (
	// EnvSVIDCertificates holds the SVID's certificate chain, leaf first.
	EnvSVIDCertificates = bootstrap.EnvSVIDCert
	// EnvSVIDKey holds the SVID's private key (PKCS #8).
	EnvSVIDKey = bootstrap.EnvSVIDKey
	// EnvSVIDBundle holds the trust domain's X.509 authorities, to verify
	// the gateway with.
	EnvSVIDBundle = bootstrap.EnvSVIDBundle
)

// SVIDVariables lists the variables a minted SVID is passed in.
func SVIDVariables() []string { return []string{EnvSVIDCertificates, EnvSVIDKey, EnvSVIDBundle} }

func executorVariables() []string { return append(bootstrap.Variables(), SVIDVariables()...) }

// Minter mints X.509-SVIDs, for instance through the SPIRE Server's SVID
// API. The backend mints one per sandbox it creates, because environment
// variables can only be given to a sandbox when it is created.
type Minter interface {
	// MintX509SVID returns a new X.509-SVID for id that expires after at
	// most ttl, and the bundle of id's trust domain.
	MintX509SVID(ctx context.Context, id spiffeid.ID, ttl time.Duration) (*x509svid.SVID, *x509bundle.Bundle, error)
}

// mintEnvironment mints an SVID for id valid for ttl and returns the
// variables that carry it. The SVID must be exactly id's, with a chain and a
// key, and the bundle must be of id's trust domain.
func mintEnvironment(ctx context.Context, m Minter, id spiffeid.ID, ttl time.Duration) (map[string]string, error) {
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
		EnvSVIDCertificates: string(certs),
		EnvSVIDKey:          string(key),
		EnvSVIDBundle:       string(authorities),
	}, nil
}
