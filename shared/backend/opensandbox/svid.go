package opensandbox

import (
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
)

// No SPIRE agent can attest a sandbox: with a Minter, each new sandbox gets
// a freshly minted X.509-SVID in its environment (bootstrap.SVIDEnvironment),
// because environment variables can only be given to a sandbox when it is
// created. Like every executor variable they are credentials: never in
// metadata, logs, events or errors.
//
// The Minter is the SPIRE Server's SVID API in a cluster (spiremint: the
// SVID then chains to the bundle the gateway trusts), or the local CA
// (svidca) where the gateway trusts that. The SVID lives the pool's job
// timeout, the sandbox's own lifetime. A mint that fails fails Create
// before any sandbox exists, and is never permanent: the next delivery of
// the assignment mints afresh. Crash window: a crash after minting and
// before the create leaves only an unused SVID in no one's hands (SPIRE
// keeps no state of it); after the create, Find returns the sandbox and
// nothing is minted again.

// executorVariables are the variables a profile may not set.
func executorVariables() []string {
	return append(bootstrap.Variables(), bootstrap.SVIDVariables()...)
}
