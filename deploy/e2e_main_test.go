//go:build e2e

package deploy

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kubeenv"
)

// plane is the one kube-apiserver + etcd of this package's end-to-end tests. Its audit log
// records who made which call (TestE2ERBAC).
var plane = kubeenv.Shared{Options: kubeenv.Options{Audit: true}}

func TestMain(m *testing.M) {
	code := m.Run()
	plane.Stop()
	os.Exit(code)
}

// clusterTest makes t a cluster test: it runs beside this package's other cluster tests
// (t.Parallel: at most go test's -parallel at once, and at most clusterenv.ClustersEnv clusters on
// the machine, across packages), and returns its context, whose timeout d starts once a cluster
// slot is t's (clusterenv.Reserve), so that waiting for another test's cluster takes nothing from
// its own time. Each cluster test shares nothing with another: its own cluster, Gitea, NATS (the
// users' keys in its configuration, not the process environment) and SPIRE.
func clusterTest(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	t.Helper()
	t.Parallel()
	return context.WithTimeout(clusterenv.Reserve(context.Background(), t), d)
}
