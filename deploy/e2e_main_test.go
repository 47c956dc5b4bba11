//go:build e2e

package deploy

import (
	"os"
	"testing"

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
