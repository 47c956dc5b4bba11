package backend

import (
	"errors"
	"fmt"
)

// PodSettings are the pod backend's own settings (BuildSettings); with
// GDR_POD_IDENTITY=ca it mints with GDR_CA_DIR's CA.
type PodSettings struct {
	KubeNamespace string `envconfig:"GDR_KUBE_NAMESPACE" default:"gitea-dynamic-runner-jobs" desc:"pod backend: the executors' namespace, of their Pods, Secrets and Events and of their SPIRE entries' k8s:ns selector; not the control plane's (the API server comes from KUBECONFIG, else the in-cluster config)"`
	SPIREServer   string `envconfig:"GDR_SPIRE_SERVER" desc:"pod backend, required: the SPIRE Server API for task registration entries: host:port (TCP, mutual TLS with this function's own SVID from the Workload API at SPIFFE_ENDPOINT_SOCKET; the server's authorization policy lists the ID as a registrar, deploy/spire/policy.rego, and limits it to task entries) or unix:<socket path> (a local caller: an admin of every entry)"`
	PodIdentity   string `envconfig:"GDR_POD_IDENTITY" default:"minted" desc:"pod backend: how an executor Pod gets its SVID: minted (handle mints it with the SPIRE Server's SVID API before the Pod exists and writes it into the Pod's own Secret: the runner holds it from its first instruction; handle's ID must be a minter in the server's policy), ca (as minted, from the installation's own CA in GDR_CA_DIR instead: no SPIRE Server, GDR_SPIRE_SERVER and GDR_CLUSTER_NAME unused) or workload-api (deploy: the components/workload-api component or Helm spire.podIdentity, which add the one cluster-wide grant, get Nodes; handle registers an entry for the Pod once it is scheduled, and the node's SPIRE agent hands the SVID out through the Workload API once it has synced the entry, up to its sync interval later)"`
	ClusterName   string `envconfig:"GDR_CLUSTER_NAME" desc:"pod backend: the cluster name of SPIRE's k8s_psat node attestor (part of every agent's SPIFFE ID)"`
	// The API client's own rate limit (client-go's token bucket), per
	// process: client-go's default of 5 requests per second held a warm
	// handle to one assignment a second (five calls each) and recover's
	// pass to 5 executors' worth of calls a second. The API server's
	// priority and fairness still applies on top.
	KubeQPS   float32 `envconfig:"GDR_KUBE_QPS" default:"50" desc:"pod backend: requests per second the Kubernetes API client of this process may send (client-side limit, sustained; handle and recover each make about 5 calls per executor they create and 3 per executor they check); negative: no client-side limit, the API server's priority and fairness alone; 0: client-go's default, 5"`
	KubeBurst int     `envconfig:"GDR_KUBE_BURST" default:"100" desc:"pod backend: requests the Kubernetes API client may send at once above GDR_KUBE_QPS (its token bucket's size); at least 1 when GDR_KUBE_QPS is positive"`
}

// The values of GDR_POD_IDENTITY (PodSettings.PodIdentity).
const (
	PodIdentityMinted      = "minted"
	PodIdentityCA          = "ca"
	PodIdentityWorkloadAPI = "workload-api"
)

// CheckPod is the pod backend's Registration.Check. The SPIRE Server
// address's form is checked when the backend is built
// (spiremint.ClientConn): this package links no gRPC, for handle's
// process-only build.
func CheckPod(c BuildSettings) error {
	var errs []error
	if c.KubeQPS > 0 && c.KubeBurst < 1 {
		errs = append(errs, fmt.Errorf("GDR_KUBE_BURST %d: want at least 1 with GDR_KUBE_QPS %v", c.KubeBurst, c.KubeQPS))
	}
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
	return errors.Join(errs...)
}
