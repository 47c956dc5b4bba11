package opensandboxbackend

import (
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
)

// No SPIRE agent can attest a sandbox: with a Minter, each new sandbox gets
// a freshly minted X.509-SVID in its environment (bootstrap.SVIDEnvironment),
// because environment variables can only be given to a sandbox when it is
// created. Like every executor variable they are credentials: never in
// metadata, logs, events or errors.

// executorVariables are the variables a profile may not set.
func executorVariables() []string {
	return append(bootstrap.Variables(), bootstrap.SVIDVariables()...)
}
