// Package backends builds the executor backend a function is configured
// for, so that handle and recover (which must agree) build it the same way.
package backends

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/opensandboxbackend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/podbackend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/processbackend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/spiremint"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskworker"
)

// Backend is what handle and recover use of a backend.
type Backend interface {
	taskworker.Backend
	taskworker.Recoverer
}

// Setup is embedded in the configuration of handle and recover: how to reach each backend.
type Setup struct {
	ProcessDir     string `envconfig:"PROCESS_DIR" default:"/var/lib/gitea-dynamic-runner/executors" desc:"process backend: one directory per executor"`
	RunnerBin      string `envconfig:"RUNNER_BIN" default:"runner" desc:"process backend: the runner binary (looked up in PATH)"`
	CADir          string `envconfig:"CA_DIR" desc:"process and opensandbox backends: directory of the local SPIFFE CA that mints executor SVIDs (created if absent); for opensandbox only where the gateway trusts this CA (GDR_OPENSANDBOX_SPIRE_SERVER in a cluster); empty for opensandbox without a SPIRE Server: no SVID is handed over"`
	OpenSandboxURL string `envconfig:"OPENSANDBOX_URL" desc:"opensandbox backend: the lifecycle API's base URL"`
	OpenSandboxKey string `envconfig:"OPENSANDBOX_API_KEY" desc:"opensandbox backend: API key (OPEN-SANDBOX-API-KEY)"`
	// OpenSandboxSPIRE names the SPIRE Server that mints sandbox SVIDs.
	OpenSandboxSPIRE string `envconfig:"OPENSANDBOX_SPIRE_SERVER" desc:"opensandbox backend: the SPIRE Server API that mints sandbox SVIDs, so that the gateway's SPIRE bundle verifies them: host:port (TCP, mutual TLS with this function's own SVID from the Workload API at SPIFFE_ENDPOINT_SOCKET, which must be one of the server's admin_ids) or unix:<socket path> (a local, hence admin, caller); connected on the first mint (recover never mints); not together with GDR_CA_DIR"`
	KubeNamespace    string `envconfig:"KUBE_NAMESPACE" default:"gitea-dynamic-runner" desc:"pod backend: the namespace of executor Pods (the API server comes from KUBECONFIG, else the in-cluster config)"`
	SPIRESocket      string `envconfig:"SPIRE_SERVER_SOCKET" default:"/run/spire/server-sockets/api.sock" desc:"pod backend: unix socket of the SPIRE Server API, for registration entries"`
	ClusterName      string `envconfig:"CLUSTER_NAME" desc:"pod backend: the cluster name of SPIRE's k8s_psat node attestor (part of every agent's SPIFFE ID)"`
}

// Check reports the settings backend kind needs and lacks, or holds in a
// combination it refuses, as New would, but without connecting to anything:
// a function checks them with the rest of its configuration, so that a
// missing setting is a configuration error (exit 2), not a failure to start.
func (c Setup) Check(kind taskassignment.Backend) error {
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
			errs = append(errs, errors.New("GDR_OPENSANDBOX_SPIRE_SERVER and GDR_CA_DIR: set one, not both, for the opensandbox backend"))
		}
		return errors.Join(errs...)
	case taskassignment.BackendPod:
		if c.ClusterName == "" {
			return errors.New("GDR_CLUSTER_NAME is required for the pod backend")
		}
	}
	return nil
}

// Deps is what a backend is built from, besides its Setup.
type Deps struct {
	Keys        taskassignment.Keys
	TrustDomain spiffeid.TrustDomain
	Pools       runnerpool.Pools
	// Log hears of executors the backend skips (corrupt metadata).
	Log *slog.Logger
}

// New builds backend kind. The returned function releases what the backend
// holds open (the SPIRE Server API connection); call it once the backend is
// no longer used.
func New(kind taskassignment.Backend, c Setup, d Deps) (Backend, func() error, error) {
	corrupt := func(name string, err error) {
		d.Log.Error("executor with corrupt metadata skipped", slog.String("executor", name), slog.Any("error", err))
	}
	none := func() error { return nil }
	switch kind {
	case taskassignment.BackendProcess:
		if c.CADir == "" {
			return nil, nil, errors.New("GDR_CA_DIR: the process backend needs a CA to mint executor SVIDs")
		}
		ca, err := svidca.LoadOrCreate(c.CADir, d.TrustDomain)
		if err != nil {
			return nil, nil, fmt.Errorf("GDR_CA_DIR: %w", err)
		}
		b, err := processbackend.New(processbackend.Config{Dir: c.ProcessDir, Runner: c.RunnerBin, Keys: d.Keys,
			TrustDomain: d.TrustDomain, Minter: ca, Env: processbackend.InheritedEnv(os.Environ()), OnCorrupt: corrupt})
		return b, none, err
	case taskassignment.BackendOpenSandbox:
		if c.OpenSandboxURL == "" {
			return nil, nil, errors.New("GDR_OPENSANDBOX_URL is required for the opensandbox backend")
		}
		client, err := opensandbox.New(opensandbox.Options{BaseURL: c.OpenSandboxURL, APIKey: c.OpenSandboxKey})
		if err != nil {
			return nil, nil, err
		}
		cfg := opensandboxbackend.Config{Sandboxes: client, Keys: d.Keys, TrustDomain: d.TrustDomain, Pools: d.Pools, OnCorrupt: corrupt}
		release := none
		switch {
		case c.OpenSandboxSPIRE != "" && c.CADir != "":
			// Which root the gateway trusts decides which one works: refuse
			// to guess.
			return nil, nil, errors.New("GDR_OPENSANDBOX_SPIRE_SERVER and GDR_CA_DIR: set one, not both, for the opensandbox backend")
		case c.OpenSandboxSPIRE != "":
			spire, err := spiremint.Dial(c.OpenSandboxSPIRE, d.TrustDomain)
			if err != nil {
				return nil, nil, fmt.Errorf("GDR_OPENSANDBOX_SPIRE_SERVER: %w", err)
			}
			cfg.Minter, release = spire, spire.Close
		case c.CADir != "":
			ca, err := svidca.LoadOrCreate(c.CADir, d.TrustDomain)
			if err != nil {
				return nil, nil, fmt.Errorf("GDR_CA_DIR: %w", err)
			}
			cfg.Minter = ca
		}
		b, err := opensandboxbackend.New(cfg)
		if err != nil {
			_ = release()
			return nil, nil, err
		}
		return b, release, nil
	case taskassignment.BackendPod:
		if c.ClusterName == "" {
			return nil, nil, errors.New("GDR_CLUSTER_NAME is required for the pod backend")
		}
		rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			if rc, err = rest.InClusterConfig(); err != nil {
				return nil, nil, fmt.Errorf("pod backend: no Kubernetes configuration (KUBECONFIG or in-cluster): %w", err)
			}
		}
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, nil, err
		}
		conn, err := grpc.NewClient("unix://"+c.SPIRESocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, fmt.Errorf("pod backend: SPIRE Server API at %s: %w", c.SPIRESocket, err)
		}
		b, err := podbackend.New(podbackend.Config{
			Client: client, Namespace: c.KubeNamespace, Keys: d.Keys, TrustDomain: d.TrustDomain, Pools: d.Pools,
			Entries: entryv1.NewEntryClient(conn), Cluster: c.ClusterName, CorruptEvents: true,
			OnCorrupt: func(x podbackend.Corrupt) { d.Log.Error("Pod with corrupt metadata skipped", slog.Any("pod", x)) },
		})
		if err != nil {
			_ = conn.Close()
			return nil, nil, err
		}
		return b, conn.Close, nil
	}
	return nil, nil, fmt.Errorf("GDR_BACKEND %q: unknown backend", kind)
}
