package backend

import (
	"errors"
	"time"
)

// OpenSandboxSettings are the opensandbox backend's own settings
// (BuildSettings); it mints with GDR_CA_DIR's CA or OpenSandboxSPIRE.
type OpenSandboxSettings struct {
	OpenSandboxURL string `envconfig:"GDR_OPENSANDBOX_URL" desc:"opensandbox backend: the lifecycle API's base URL"`
	OpenSandboxKey string `envconfig:"GDR_OPENSANDBOX_API_KEY" desc:"opensandbox backend: API key (OPEN-SANDBOX-API-KEY)"`
	// OpenSandboxSPIRE names the SPIRE Server that mints sandbox SVIDs.
	OpenSandboxSPIRE string `envconfig:"GDR_OPENSANDBOX_SPIRE_SERVER" desc:"opensandbox backend: the SPIRE Server API that mints sandbox SVIDs, so that the gateway's SPIRE bundle verifies them: host:port (TCP, mutual TLS with this function's own SVID from the Workload API at SPIFFE_ENDPOINT_SOCKET, which must be one of the server's admin_ids) or unix:<socket path> (a local, hence admin, caller); connected on the first mint (recover never mints); not together with GDR_CA_DIR"`
	// OpenSandboxMaxTimeout is the server's max_sandbox_timeout_seconds.
	OpenSandboxMaxTimeout time.Duration `envconfig:"GDR_OPENSANDBOX_MAX_TIMEOUT" default:"24h" desc:"opensandbox backend: the server's max_sandbox_timeout_seconds (its default: 86400 s); a pool whose job timeout is longer gets sandboxes of this timeout, with a warning when the backend starts (the server refuses a longer one)"`
}

// CheckOpenSandbox is the opensandbox backend's Registration.Check.
func CheckOpenSandbox(c BuildSettings) error {
	var errs []error
	if c.OpenSandboxURL == "" {
		errs = append(errs, errors.New("GDR_OPENSANDBOX_URL is required for the opensandbox backend"))
	}
	if c.OpenSandboxSPIRE != "" && c.CADir != "" {
		// Which root the gateway trusts decides which one works:
		// refuse to guess.
		errs = append(errs, errors.New("GDR_OPENSANDBOX_SPIRE_SERVER and GDR_CA_DIR: set one, not both, for the opensandbox backend"))
	}
	return errors.Join(errs...)
}
