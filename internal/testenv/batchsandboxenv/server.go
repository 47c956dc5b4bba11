package batchsandboxenv

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/opensandboxenv"
)

// StartServer starts OpenSandbox's lifecycle server with its Kubernetes
// runtime (provider batchsandbox) against c, as cluster-admin, with its
// workloads in namespace ns, and registers its Stop with t.Cleanup
// (opensandboxenv.StartKubernetes: the server, its config and what it
// answers). It creates ns unless it exists and waits for its default
// service account. The caller must have started the manager (Start) and
// imported the images (ImportImages): the server's execd_image is
// ExecdImage.
//
// It needs both peers: this package's (Assets) and the Docker-runtime
// peer's root, where the server's Python runs (opensandboxenv.Peer);
// either missing skips the test, or fails it with CI=true.
func StartServer(ctx context.Context, t testing.TB, c *clusterenv.Cluster, ns string) *opensandboxenv.Server {
	t.Helper()
	Assets(t)
	kube := c.Client(t)
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("batchsandboxenv: create namespace %s: %v", ns, err)
	}
	c.WaitServiceAccount(ctx, t, ns)
	return opensandboxenv.StartKubernetes(ctx, t, opensandboxenv.KubernetesOptions{
		Kubeconfig: c.AdminKubeconfig(),
		Namespace:  ns,
		ExecdImage: ExecdImage,
	})
}

// StartWorld starts what a test of the Kubernetes runtime's lifecycle server
// needs, in order: a single-node cluster (clusterenv.Start), the images
// (ImportImages), the manager (Start) and the server with its workloads in
// namespace ns (StartServer). Both peers are checked before the cluster
// starts: either missing skips the test, or fails it with CI=true.
func StartWorld(ctx context.Context, t testing.TB, ns string) (*clusterenv.Cluster, *opensandboxenv.Server) {
	t.Helper()
	Assets(t)
	testenv.RequirePeer(t, opensandboxenv.Peer)
	t0 := time.Now()
	c := clusterenv.Start(ctx, t)
	ImportImages(ctx, t, c)
	Start(ctx, t, c)
	s := StartServer(ctx, t, c, ns)
	t.Logf("cluster, images, manager and lifecycle server ready in %s", time.Since(t0).Round(time.Second))
	return c, s
}
