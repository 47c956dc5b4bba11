package sandboxapitest_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
)

// driftEnv, set in the environment of a child test process, makes
// TestContractFake run against a fake that answers as another runtime: how
// TestContractCatchesDrift checks that the contract fails on a drift.
const driftEnv = "SANDBOXAPITEST_CONTRACT_DRIFT"

// The fake answers every case of the contract as the real server of the
// Docker runtime answered (docs/OPENSANDBOX.md); the e2e test
// TestE2EOpenSandboxContractDocker runs the same cases against the real
// server.
func TestContractFake(t *testing.T) {
	opts := []sandboxapitest.Option{sandboxapitest.WithAPIKey("contract-key")}
	if os.Getenv(driftEnv) == "kubernetes" {
		opts = append(opts, sandboxapitest.WithRuntime(sandboxapitest.Kubernetes))
	}
	fake := sandboxapitest.New(t, opts...)
	sandboxapitest.RunContract(t, sandboxapitest.Target{
		URL:    fake.URL,
		APIKey: "contract-key",
		Image:  "gdr-test/opensandbox-sandbox:latest",
		Exit:   fake.Exit,
		Expire: fake.Expire,
		Wait:   time.Second,
	})
}

// The fake of the Kubernetes runtime answers every case of the contract as
// the real server of that runtime answered (docs/OPENSANDBOX-KUBERNETES.md);
// TestE2EOpenSandboxContractKubernetes (contract_k8s_e2e_test.go, tag e2e)
// runs the same cases against the real server. The
// crash-loop back-off is short so that an exit's Failed shows within Wait.
func TestContractFakeKubernetes(t *testing.T) {
	fake := sandboxapitest.New(t, sandboxapitest.WithAPIKey("contract-key"),
		sandboxapitest.WithRuntime(sandboxapitest.Kubernetes), sandboxapitest.WithCrashLoopBackOff(200*time.Millisecond))
	sandboxapitest.RunContract(t, sandboxapitest.Target{
		Runtime: sandboxapitest.Kubernetes,
		URL:     fake.URL,
		APIKey:  "contract-key",
		Image:   "gdr.local/opensandbox-sandbox:4db3a993",
		Exit:    fake.Exit,
		Expire:  fake.Expire,
		Wait:    time.Second,
	})
}

// The contract is no tautology: against a fake answering as the Kubernetes
// runtime (other codes, Pending after an exit), its cases fail.
func TestContractCatchesDrift(t *testing.T) {
	if os.Getenv(driftEnv) != "" {
		t.Skip("the child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestContractFake$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), driftEnv+"=kubernetes")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the contract passed against the Kubernetes runtime's fake:\n%s", out)
	}
	for _, want := range []string{
		"--- FAIL: TestContractFake/contract/create-answers-running",
		"--- FAIL: TestContractFake/contract/exit-0",
		"--- FAIL: TestContractFake/contract/expiry-removes-404",
		"KUBERNETES::SANDBOX_NOT_FOUND",
		"--- PASS: TestContractFake/contract/no-api-key-401",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the drifted run's output lacks %q:\n%s", want, out)
		}
	}
}
