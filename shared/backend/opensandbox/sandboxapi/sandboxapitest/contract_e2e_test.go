//go:build e2e

package sandboxapitest_test

import (
	"context"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/opensandboxenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
)

// The real server (the Docker runtime, pinned peer) answers every case of
// the contract as the fake does (TestContractFake runs the same cases
// against the fake): a failure here is the real server drifting from what
// the fake, and the backend tested against it, assume. The entrypoints exit
// by themselves (sh -c "sleep 2; exit N"); the expiry case waits for its
// 60 s timeout, so the run takes about 70 s after the server started.
func TestE2EOpenSandboxContractDocker(t *testing.T) {
	if opensandboxenv.MaxSandboxTimeout != sandboxapitest.DefaultMaxTimeout {
		t.Fatalf("the server's maximum timeout %s is not the contract's %s", opensandboxenv.MaxSandboxTimeout, sandboxapitest.DefaultMaxTimeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := opensandboxenv.Start(ctx, t, opensandboxenv.Options{NoRunner: true})
	start := time.Now()
	sandboxapitest.RunContract(t, sandboxapitest.Target{
		URL:    s.URL,
		APIKey: s.APIKey,
		Image:  opensandboxenv.SandboxImage,
		Wait:   time.Minute,
	})
	t.Logf("the contract's cases took %s against the real server", time.Since(start).Round(time.Second))
}
