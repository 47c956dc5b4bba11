// Package backend is how handle and recover (which must agree) build the
// executor backend they are configured for: its settings (BuildSettings),
// what it is built from (Deps), and the builders a binary links (Builders).
// What a backend does is the executor contract (shared/executor).
//
// Each backend and its Build live in a package of their own below this one
// (backend/process, backend/opensandbox, backend/pod), and this one imports
// none of them:
// a binary links a backend's client (client-go for the pod backend, gRPC
// for SPIRE, the OpenSandbox API client) and pays for its package
// initialisation only when it imports that builder. Nothing connects before
// a builder runs.
package backend

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Backend is what handle and recover use of a backend.
type Backend interface {
	executor.Backend
	executor.Recoverer
}

// BuildSettings is embedded in the configuration of handle and recover: how to reach each backend.
type BuildSettings struct {
	ProcessDir     string `envconfig:"GDR_PROCESS_DIR" default:"/var/lib/gitea-dynamic-runner/executors" desc:"process backend: one directory per executor"`
	RunnerBin      string `envconfig:"GDR_RUNNER_BIN" default:"runner" desc:"process backend: the runner binary (looked up in PATH)"`
	CADir          string `envconfig:"GDR_CA_DIR" desc:"process and opensandbox backends: directory of the local SPIFFE CA that mints executor SVIDs (created if absent); for opensandbox only where the gateway trusts this CA (GDR_OPENSANDBOX_SPIRE_SERVER in a cluster); empty for opensandbox without a SPIRE Server: no SVID is handed over. Pod backend with GDR_POD_IDENTITY=ca: the installation's CA (ca.pem, ca-key.pem, and bundle.pem during a rotation), read on handle's first mint, never created"`
	OpenSandboxURL string `envconfig:"GDR_OPENSANDBOX_URL" desc:"opensandbox backend: the lifecycle API's base URL"`
	OpenSandboxKey string `envconfig:"GDR_OPENSANDBOX_API_KEY" desc:"opensandbox backend: API key (OPEN-SANDBOX-API-KEY)"`
	// OpenSandboxSPIRE names the SPIRE Server that mints sandbox SVIDs.
	OpenSandboxSPIRE string `envconfig:"GDR_OPENSANDBOX_SPIRE_SERVER" desc:"opensandbox backend: the SPIRE Server API that mints sandbox SVIDs, so that the gateway's SPIRE bundle verifies them: host:port (TCP, mutual TLS with this function's own SVID from the Workload API at SPIFFE_ENDPOINT_SOCKET, which must be one of the server's admin_ids) or unix:<socket path> (a local, hence admin, caller); connected on the first mint (recover never mints); not together with GDR_CA_DIR"`
	// OpenSandboxMaxTimeout is the server's max_sandbox_timeout_seconds.
	OpenSandboxMaxTimeout time.Duration `envconfig:"GDR_OPENSANDBOX_MAX_TIMEOUT" default:"24h" desc:"opensandbox backend: the server's max_sandbox_timeout_seconds (its default: 86400 s); a pool whose job timeout is longer gets sandboxes of this timeout, with a warning when the backend starts (the server refuses a longer one)"`
	KubeNamespace         string        `envconfig:"GDR_KUBE_NAMESPACE" default:"gitea-dynamic-runner-jobs" desc:"pod backend: the executors' namespace, of their Pods, Secrets and Events and of their SPIRE entries' k8s:ns selector; not the control plane's (the API server comes from KUBECONFIG, else the in-cluster config)"`
	SPIREServer           string        `envconfig:"GDR_SPIRE_SERVER" desc:"pod backend, required: the SPIRE Server API for task registration entries: host:port (TCP, mutual TLS with this function's own SVID from the Workload API at SPIFFE_ENDPOINT_SOCKET; the server's authorization policy lists the ID as a registrar, deploy/spire/policy.rego, and limits it to task entries) or unix:<socket path> (a local caller: an admin of every entry)"`
	PodIdentity           string        `envconfig:"GDR_POD_IDENTITY" default:"minted" desc:"pod backend: how an executor Pod gets its SVID: minted (handle mints it with the SPIRE Server's SVID API before the Pod exists and writes it into the Pod's own Secret: the runner holds it from its first instruction; handle's ID must be a minter in the server's policy), ca (as minted, from the installation's own CA in GDR_CA_DIR instead: no SPIRE Server, GDR_SPIRE_SERVER and GDR_CLUSTER_NAME unused) or workload-api (deploy: the components/workload-api component or Helm spire.podIdentity, which add the one cluster-wide grant, get Nodes; handle registers an entry for the Pod once it is scheduled, and the node's SPIRE agent hands the SVID out through the Workload API once it has synced the entry, up to its sync interval later)"`
	ClusterName           string        `envconfig:"GDR_CLUSTER_NAME" desc:"pod backend: the cluster name of SPIRE's k8s_psat node attestor (part of every agent's SPIFFE ID)"`
}

// The values of GDR_POD_IDENTITY (BuildSettings.PodIdentity).
const (
	PodIdentityMinted      = "minted"
	PodIdentityCA          = "ca"
	PodIdentityWorkloadAPI = "workload-api"
)

// Check reports the settings backend kind needs and lacks, or holds in a
// combination it refuses, as its builder would, but without connecting to
// anything: a function checks them with the rest of its configuration, so
// that a missing setting is a configuration error (exit 2), not a failure
// to start. Every builder starts with this check.
func (c BuildSettings) Check(kind taskassignment.BackendKind) error {
	switch kind {
	case taskassignment.BackendProcess:
		if c.CADir == "" {
			return errors.New("GDR_CA_DIR: the process backend needs a CA to mint executor SVIDs")
		}
	case taskassignment.BackendOpenSandbox:
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
	case taskassignment.BackendPod:
		var errs []error
		switch c.PodIdentity {
		case PodIdentityCA:
			if c.CADir == "" {
				errs = append(errs, errors.New("GDR_CA_DIR is required for the pod backend with GDR_POD_IDENTITY=ca: the folder of the installation's CA (a Secret volume)"))
			}
			return errors.Join(errs...)
		case PodIdentityMinted, PodIdentityWorkloadAPI:
		default:
			errs = append(errs, fmt.Errorf("GDR_POD_IDENTITY %q: want %s, %s or %s", c.PodIdentity, PodIdentityMinted, PodIdentityCA, PodIdentityWorkloadAPI))
		}
		if c.ClusterName == "" {
			errs = append(errs, errors.New("GDR_CLUSTER_NAME is required for the pod backend"))
		}
		if c.SPIREServer == "" {
			errs = append(errs, errors.New("GDR_SPIRE_SERVER is required for the pod backend: the SPIRE Server's TCP API (host:port), or unix:<admin socket path>"))
		}
		// Its form is checked when the backend is built (spiremint.ClientConn):
		// this package links no gRPC, for handle's process-only build.
		return errors.Join(errs...)
	}
	return nil
}

// Deps is what a backend is built from, besides its BuildSettings.
type Deps struct {
	Keys        taskassignment.Keys
	TrustDomain spiffeid.TrustDomain
	Pools       runnerpool.Pools
	// Log hears of executors the backend skips (corrupt metadata).
	Log *slog.Logger
}

// Builder builds one backend from c and d, after c.Check of its kind. The
// returned function releases what the backend holds open (a SPIRE Server
// API connection); call it once the backend is no longer used.
type Builder func(c BuildSettings, d Deps) (Backend, func() error, error)

// Builders are the backends a binary links, by kind. A nil Builder counts as
// not linked.
type Builders map[taskassignment.BackendKind]Builder

// Linked reports nil when kind's builder is linked, else an error naming
// GDR_BACKEND and the kinds that are.
func (bs Builders) Linked(kind taskassignment.BackendKind) error {
	if _, err := taskassignment.ParseBackendKind(string(kind)); err != nil {
		return fmt.Errorf("GDR_BACKEND %q: unknown backend", kind)
	}
	if bs[kind] == nil {
		return fmt.Errorf("GDR_BACKEND %q: this binary was built without that backend; it has %s", kind, bs.kinds())
	}
	return nil
}

// kinds lists the linked kinds, sorted, for messages ("none" for none).
func (bs Builders) kinds() string {
	var ks []string
	for k, b := range bs {
		if b != nil {
			ks = append(ks, string(k))
		}
	}
	if len(ks) == 0 {
		return "none"
	}
	slices.Sort(ks)
	return strings.Join(ks, ", ")
}

// New builds backend kind with its builder. The returned function releases
// what the backend holds open; call it once the backend is no longer used.
func (bs Builders) New(kind taskassignment.BackendKind, c BuildSettings, d Deps) (Backend, func() error, error) {
	if err := bs.Linked(kind); err != nil {
		return nil, nil, err
	}
	return bs[kind](c, d)
}

// Corrupt returns the OnCorrupt hook of a backend's configuration: an
// executor with corrupt metadata is logged on d.Log and skipped.
func (d Deps) Corrupt() func(name string, err error) {
	return func(name string, err error) {
		d.Log.Error("executor with corrupt metadata skipped", slog.String("executor", name), slog.Any("error", err))
	}
}
