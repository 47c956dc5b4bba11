//go:build linux

package runner

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
)

const (
	// envUndumpNeedle is, hex-encoded, what the step looks for.
	envUndumpNeedle = "GDR_TEST_UNDUMP_NEEDLE"
	// envUndumpTarget is the runner's process ID.
	envUndumpTarget = "GDR_TEST_UNDUMP_TARGET"
)

// nobody is the unprivileged user the test runs the runner and its step as
// when it runs as root (root's CAP_SYS_PTRACE passes every check).
const nobody = 65534

// TestStepsCannotReadTheRunnersMemory: a job's step is a process of the
// runner's own user, yet it cannot read the runner's memory, where its SVID
// key and capability are: the re-executed runner makes itself non-dumpable
// before it reads its bootstrap values, so /proc/<runner>/mem (and maps,
// environ, ptrace) are closed to its steps. Without that, the same step
// finds the capability in the runner's memory.
func TestStepsCannotReadTheRunnersMemory(t *testing.T) {
	exe, cred := unprivilegedTestBinary(t)
	for _, tc := range []struct {
		mode string
		want func(pid int) string
	}{
		// The fault: an unprotected runner's capability is in its memory, for a step to read.
		{"control", func(int) string { return "found the capability\n" }},
		{"runner", func(pid int) string {
			return fmt.Sprintf("open /proc/%[1]d/mem: permission denied\nopen /proc/%[1]d/maps: permission denied\nopen /proc/%[1]d/environ: permission denied\n", pid)
		}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			cmd := exec.Command(exe)
			cmd.Dir = filepath.Dir(exe)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
			cmd.Env = append(os.Environ(), envUndumpChild+"="+tc.mode,
				bootstrap.EnvAssignmentID+"=linux-7", bootstrap.EnvTaskID+"=7",
				bootstrap.EnvSPIFFEID+"=spiffe://ci.example.org/repo/alice/repo/task/7",
				bootstrap.EnvCapability+"=capability-"+strings.Repeat("7e57", 16),
				bootstrap.EnvGatewayURL+"=https://gateway.example.org",
				bootstrap.EnvGatewayID+"=spiffe://ci.example.org/gateway")
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			if err := cmd.Run(); err != nil {
				t.Fatalf("runner: %v\n%s", err, errOut.String())
			}
			if want := tc.want(cmd.Process.Pid); out.String() != want {
				t.Fatalf("the step printed %q, want %q\n%s", out.String(), want, errOut.String())
			}
		})
	}
}

// unprivilegedTestBinary returns the test binary to run as a user without
// CAP_SYS_PTRACE, and the credential to run it with: as root, a copy that
// nobody may execute, run as nobody; otherwise the binary itself as is.
func unprivilegedTestBinary(t *testing.T) (string, *syscall.Credential) {
	t.Helper()
	if os.Geteuid() != 0 {
		return os.Args[0], nil
	}
	dir, err := os.MkdirTemp("", "gdr-undump-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	exe := filepath.Join(dir, "runner.test")
	dst, err := os.OpenFile(exe, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return exe, &syscall.Credential{Uid: nobody, Gid: nobody}
}

// undumpChild plays the part mode names (see envUndumpChild) and returns
// its exit status.
func undumpChild(mode string) int {
	switch mode {
	case "step":
		return stepReadsTheRunner()
	case "runner", "control":
	default:
		fmt.Fprintf(os.Stderr, "unknown part %q\n", mode)
		return 3
	}
	fd := -1
	for _, arg := range os.Args[1:] {
		_, _ = fmt.Sscanf(arg, "-bootstrap-fd=%d", &fd)
	}
	if fd < 0 {
		return scrubAndReexec(os.Args[:1])
	}
	start := secondSelf
	if mode == "control" {
		start = readValues
	}
	v, err := start(fd)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	exe, err := os.Executable() // reads /proc/self/exe, which stays the runner's own
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	step := exec.Command(exe)
	step.Env = append(os.Environ(), envUndumpChild+"=step",
		envUndumpNeedle+"="+hex.EncodeToString([]byte(v.Capability)), // not the capability itself: the step must find that in the values
		envUndumpTarget+"="+strconv.Itoa(os.Getpid()))
	step.Stdout, step.Stderr = os.Stdout, os.Stderr
	err = step.Run()
	runtime.KeepAlive(&v)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	return 0
}

// stepReadsTheRunner looks for the needle in the readable memory of the
// target process and prints what it found, or why it could not look: the
// errors of opening its mem, maps and environ.
func stepReadsTheRunner() int {
	needle, err := hex.DecodeString(os.Getenv(envUndumpNeedle))
	if err != nil || len(needle) == 0 {
		fmt.Fprintln(os.Stderr, "no needle")
		return 3
	}
	proc := "/proc/" + os.Getenv(envUndumpTarget)
	mem, memErr := os.Open(proc + "/mem")
	maps, mapsErr := os.ReadFile(proc + "/maps")
	_, environErr := os.ReadFile(proc + "/environ")
	if memErr != nil || mapsErr != nil || environErr != nil {
		fmt.Printf("%v\n%v\n%v\n", memErr, mapsErr, environErr)
		return 0
	}
	defer mem.Close()
	const chunk = 1 << 20
	buf := make([]byte, chunk+len(needle))
	for _, line := range strings.Split(string(maps), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || !strings.HasPrefix(fields[1], "r") {
			continue
		}
		from, to, _ := strings.Cut(fields[0], "-")
		lo, err1 := strconv.ParseUint(from, 16, 64)
		hi, err2 := strconv.ParseUint(to, 16, 64)
		if err1 != nil || err2 != nil || hi > math.MaxInt64 {
			continue
		}
		for off := lo; off < hi; off += chunk {
			n := min(uint64(len(buf)), hi-off)
			got, _ := mem.ReadAt(buf[:n], int64(off))
			if bytes.Contains(buf[:got], needle) {
				fmt.Println("found the capability")
				return 0
			}
		}
	}
	fmt.Println("not found")
	return 0
}
