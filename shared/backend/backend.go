// Package backend is how handle and recover (which must agree) build the
// executor backend they are configured for: its settings (BuildSettings),
// what it is built from (Deps), and the backends a binary links (Registry,
// of one Registration per backend). What a backend does is the executor
// contract (shared/executor); docs/ADDING-A-BACKEND.md is the recipe.
//
// Each backend and its Build live in a package of their own below this one
// (backend/process, backend/opensandbox, backend/pod), whose Registration
// function names them; package backend/linked (generated) is the one list
// of them, by build tag. This one imports none of them:
// a binary links a backend's client (client-go for the pod backend, gRPC
// for SPIRE, the OpenSandbox API client) and pays for its package
// initialisation only when it imports that builder. Nothing connects before
// a builder runs.
package backend

import (
	"log/slog"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// BuildSettings is embedded in the configuration of handle and recover: how
// to reach each backend. Each backend's own settings are a struct of their
// own in a file of this package (settings_<kind>.go, with the backend's
// Registration.Check), embedded here; GDR_CA_DIR is shared by three.
// They live here, not in the backend's package, so that a binary that does
// not link a backend still reads (and documents) its settings.
type BuildSettings struct {
	ProcessSettings
	CADir string `envconfig:"GDR_CA_DIR" desc:"process and opensandbox backends: directory of the local SPIFFE CA that mints executor SVIDs (created if absent); for opensandbox only where the gateway trusts this CA (GDR_OPENSANDBOX_SPIRE_SERVER in a cluster); empty for opensandbox without a SPIRE Server: no SVID is handed over. Pod backend with GDR_POD_IDENTITY=ca: the installation's CA (ca.pem, ca-key.pem, and bundle.pem during a rotation), read on handle's first mint, never created"`
	OpenSandboxSettings
	PodSettings
}

// Deps is what a backend is built from, besides its BuildSettings.
type Deps struct {
	Keys        taskassignment.Keys
	TrustDomain spiffeid.TrustDomain
	Pools       runnerpool.Pools
	// Log hears of executors the backend skips (corrupt metadata).
	Log *slog.Logger
}

// Builder builds one backend from c and d; it starts with its
// Registration's Check. The returned function releases what the backend
// holds open (a SPIRE Server API connection); call it once the backend is
// no longer used.
type Builder func(c BuildSettings, d Deps) (executor.Backend, func() error, error)

// Corrupt returns the OnCorrupt hook of a backend's configuration: an
// executor with corrupt metadata is logged on d.Log and skipped.
func (d Deps) Corrupt() func(name string, err error) {
	return func(name string, err error) {
		d.Log.Error("executor with corrupt metadata skipped", slog.String("executor", name), slog.Any("error", err))
	}
}
