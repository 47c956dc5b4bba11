//go:build e2e

package sandboxapitest_test

import (
	"context"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/batchsandboxenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/opensandboxenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
)

// The real server of the Kubernetes runtime (provider batchsandbox, the
// pinned peers, on a real cluster) answers every case of the contract as
// the fake of that runtime does (TestContractFakeKubernetes runs the same
// cases against sandboxapitest.New(..., WithRuntime(Kubernetes))): a
// failure here is the real server drifting from what the fake, and the
// backend tested against it, assume. The entrypoints exit by themselves
// (sh -c "sleep 2; exit N") and turn Failed by the crash loop about 25 s
// after creation; the expiry case waits for its 60 s timeout.
func TestE2EOpenSandboxContractKubernetes(t *testing.T) {
	if opensandboxenv.MaxSandboxTimeout != sandboxapitest.DefaultMaxTimeout {
		t.Fatalf("the server's maximum timeout %s is not the contract's %s", opensandboxenv.MaxSandboxTimeout, sandboxapitest.DefaultMaxTimeout)
	}
	// Its timeout starts once a cluster slot is its (clusterenv.Reserve).
	ctx, cancel := context.WithTimeout(clusterenv.Reserve(context.Background(), t), 12*time.Minute)
	defer cancel()
	_, s := batchsandboxenv.StartWorld(ctx, t, "opensandbox")
	start := time.Now()
	sandboxapitest.RunContract(t, sandboxapitest.Target{
		Runtime: sandboxapitest.Kubernetes,
		URL:     s.URL,
		APIKey:  s.APIKey,
		Image:   batchsandboxenv.SandboxImage,
		Wait:    time.Minute,
	})
	t.Logf("the contract's cases took %s against the real server", time.Since(start).Round(time.Second))
}
