package runner

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
)

// envHandoverChild makes the test binary act as the runner's two selves:
// the first scrubs and re-executes, the second (with -bootstrap-fd) reads the
// values back and prints what it got.
const envHandoverChild = "GDR_TEST_HANDOVER_CHILD"

// envUndumpChild makes the test binary play the runner's two selves
// ("runner": the second self starts as Main starts it; "control": the same
// without secondSelf) that then run a step, or the step ("step").
const envUndumpChild = "GDR_TEST_UNDUMP_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(envHandoverChild) == "1" {
		os.Exit(handoverChild())
	}
	if mode := os.Getenv(envUndumpChild); mode != "" {
		os.Exit(undumpChild(mode))
	}
	os.Exit(m.Run())
}

func handoverChild() int {
	for _, arg := range os.Args[1:] {
		var fd int
		if _, err := fmt.Sscanf(arg, "-bootstrap-fd=%d", &fd); err == nil {
			v, err := secondSelf(fd)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 3
			}
			sum := sha256.Sum256([]byte(v.SVIDBundle))
			leaked := []string{}
			for _, name := range secretVars() {
				if _, ok := os.LookupEnv(name); ok {
					leaked = append(leaked, name)
				}
			}
			h := v.host()
			fmt.Printf("task=%d gateway=%s bundle=%s socket=%s services=%s timeout=%s leaked=%s\n", v.TaskID, v.GatewayID, hex.EncodeToString(sum[:]), v.Socket,
				strings.Join(h.Services, ","), h.ServiceTimeout, strings.Join(leaked, ","))
			return 0
		}
	}
	return scrubAndReexec(os.Args[:1])
}

// The hand-over to the re-executed runner completes whatever the size of the
// values: a trust bundle of many authorities once filled a pipe's buffer
// with nobody reading, and the runner hung before its first step.
func TestHandoverOfLargeValues(t *testing.T) {
	// One variable holds at most 128 KiB (MAX_ARG_STRLEN); a pipe buffers 64 KiB.
	for _, size := range []int{1 << 10, 100 << 10, 120 << 10} {
		t.Run(fmt.Sprintf("bundle of %d bytes", size), func(t *testing.T) {
			bundle := strings.Repeat("A", size)
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), envHandoverChild+"=1",
				bootstrap.EnvAssignmentID+"=linux-7", bootstrap.EnvTaskID+"=7",
				bootstrap.EnvSPIFFEID+"=spiffe://ci.example.org/repo/alice/repo/task/7",
				bootstrap.EnvCapability+"=cap", bootstrap.EnvGatewayURL+"=https://gateway.example.org",
				bootstrap.EnvGatewayID+"=spiffe://ci.example.org/gateway",
				bootstrap.EnvSVIDBundle+"="+bundle)
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("runner: %v\n%s", err, errOut.String())
				}
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("the hand-over hung")
			}
			sum := sha256.Sum256([]byte(bundle))
			want := fmt.Sprintf("task=7 gateway=spiffe://ci.example.org/gateway bundle=%s socket= services= timeout=0s leaked=\n", hex.EncodeToString(sum[:]))
			if out.String() != want {
				t.Fatalf("re-executed runner printed %q, want %q", out.String(), want)
			}
		})
	}
}

// The pod backend sets SPIFFE_ENDPOINT_SOCKET in the runner container (the
// SPIFFE CSI volume's or the hostPath's socket): the runner hands the address
// over to its re-executed self, which reaches the Workload API with it, and
// the job's steps never see the variable.
func TestWorkloadAPISocketHandedOverNotLeaked(t *testing.T) {
	const socket = "unix:///spiffe-workload-api/spire-agent.sock"
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envHandoverChild+"=1",
		bootstrap.EnvAssignmentID+"=linux-7", bootstrap.EnvTaskID+"=7",
		bootstrap.EnvSPIFFEID+"=spiffe://ci.example.org/repo/alice/repo/task/7",
		bootstrap.EnvCapability+"=cap", bootstrap.EnvGatewayURL+"=https://gateway.example.org",
		bootstrap.EnvGatewayID+"=spiffe://ci.example.org/gateway",
		"SPIFFE_ENDPOINT_SOCKET="+socket)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("runner: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(string(out), " socket="+socket+" ") || !strings.HasSuffix(string(out), " leaked=\n") {
		t.Fatalf("re-executed runner printed %q: want the socket handed over and nothing leaked", out)
	}
}

// The pod backend tells the runner which services run beside it, and how
// long to wait for them: the re-executed runner gets both, the steps see
// neither. A timeout that does not parse leaves the default (0).
func TestServicesHandedOverNotLeaked(t *testing.T) {
	for _, tc := range []struct{ timeout, want string }{
		{"45s", " services=postgres,redis timeout=45s leaked=\n"},
		{"soon", " services=postgres,redis timeout=0s leaked=\n"},
	} {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), envHandoverChild+"=1",
			bootstrap.EnvAssignmentID+"=linux-7", bootstrap.EnvTaskID+"=7",
			bootstrap.EnvSPIFFEID+"=spiffe://ci.example.org/repo/alice/repo/task/7",
			bootstrap.EnvCapability+"=cap", bootstrap.EnvGatewayURL+"=https://gateway.example.org",
			bootstrap.EnvGatewayID+"=spiffe://ci.example.org/gateway",
			bootstrap.EnvJobServices+"=postgres,redis", bootstrap.EnvServiceTimeout+"="+tc.timeout)
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("runner: %v\n%s", err, errOut.String())
		}
		if !strings.HasSuffix(string(out), tc.want) {
			t.Fatalf("re-executed runner printed %q, want it to end in %q", out, tc.want)
		}
	}
}
