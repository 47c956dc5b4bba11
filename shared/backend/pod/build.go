package pod

import (
	"fmt"
	"log/slog"

	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/spiremint"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// KubernetesClient is a client of the API server KUBECONFIG names, else of
// the in-cluster configuration (a Pod's ServiceAccount), with client-go's
// default rate limit (5 requests per second, bursts of 10).
func KubernetesClient() (kubernetes.Interface, error) { return LimitedClient(0, 0) }

// LimitedClient is KubernetesClient sending at most qps requests per second
// in bursts of up to burst (client-go's token bucket; a negative qps: no
// client-side limit; zero for either: client-go's default).
func LimitedClient(qps float32, burst int) (kubernetes.Interface, error) {
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		if rc, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("no Kubernetes configuration (KUBECONFIG or in-cluster): %w", err)
		}
	}
	rc.QPS, rc.Burst = qps, burst
	return kubernetes.NewForConfig(rc)
}

// Registration is the pod backend's (GDR_BACKEND=pod), as package
// backend/linked links it.
func Registration() backend.Registration {
	return backend.Registration{Kind: taskassignment.BackendPod, Check: backend.CheckPod, Build: Build}
}

// Build is the pod backend's backend.Builder: the API server comes from
// KUBECONFIG, else the in-cluster configuration, and its client sends at
// most c.KubeQPS requests per second (c.KubeBurst at once); the SPIRE Server API from
// c.SPIREServer (gRPC connects on first use, see spiremint.ClientConn), for
// entries and, with GDR_POD_IDENTITY=minted, SVIDs (Config.Minter); with
// GDR_POD_IDENTITY=ca, SVIDs come from the CA in c.CADir and there is no
// SPIRE connection. The returned function closes the SPIRE connection.
func Build(c backend.BuildSettings, d backend.Deps) (executor.Backend, func() error, error) {
	if err := backend.CheckPod(c); err != nil {
		return nil, nil, err
	}
	client, err := LimitedClient(c.KubeQPS, c.KubeBurst)
	if err != nil {
		return nil, nil, fmt.Errorf("pod backend: %w", err)
	}
	cfg := Config{
		Client: client, Namespace: c.KubeNamespace, Keys: d.Keys, TrustDomain: d.TrustDomain, Pools: d.Pools,
		Cluster: c.ClusterName, CorruptEvents: true,
		OnCorrupt: func(x Corrupt) { d.Log.Error("Pod with corrupt metadata skipped", slog.Any("pod", x)) },
	}
	if c.PodIdentity == backend.PodIdentityCA {
		// No SPIRE at all: the installation's CA, read on the first mint
		// (recover, which never mints, never reads its key).
		cfg.Minter = svidca.NewDeferred(c.CADir, d.TrustDomain)
		b, err := New(cfg)
		if err != nil {
			return nil, nil, err
		}
		return b, func() error { return nil }, nil
	}
	conn, closeConn, err := spiremint.ClientConn(c.SPIREServer, d.TrustDomain)
	if err != nil {
		return nil, nil, fmt.Errorf("pod backend: GDR_SPIRE_SERVER: %w", err)
	}
	cfg.Entries = entryv1.NewEntryClient(conn)
	if c.PodIdentity == backend.PodIdentityMinted {
		// The same connection: recover, which never mints, never uses it
		// for that.
		cfg.Minter = spiremint.New(conn)
	}
	b, err := New(cfg)
	if err != nil {
		_ = closeConn()
		return nil, nil, err
	}
	return b, closeConn, nil
}
