package chaos

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
)

// fetchClientEnv names what TestFetchClientProcess needs: the run's
// role for this test binary, and the folder it signals in.
const (
	fetchClientEnv = "CHAOS_TEST_FETCH_CLIENT"
	fetchClientDir = "CHAOS_TEST_FETCH_DIR"
)

// TestFetchClientProcess is not a test: run as a process of a fleet by
// TestCallOfAKilledProcessIsAttributed, it sends one FetchTask to
// GDR_GITEA_URL on a connection of its own, with the runner's credentials
// of its environment, says so (a file "sent" in its folder), and waits to
// be killed without reading the answer.
func TestFetchClientProcess(t *testing.T) {
	if os.Getenv(fetchClientEnv) == "" {
		t.Skip("a helper process of TestCallOfAKilledProcessIsAttributed")
	}
	u, err := url.Parse(os.Getenv("GDR_GITEA_URL"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	body := "{}"
	req := fmt.Sprintf("POST %sapi/actions/runner.v1.RunnerService/FetchTask HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"Connect-Protocol-Version: 1\r\nx-runner-uuid: %s\r\nx-runner-token: %s\r\nContent-Length: %d\r\n\r\n%s",
		u.Path, u.Host, os.Getenv(fetchClientEnv+"_UUID"), os.Getenv(fetchClientEnv+"_TOKEN"), len(body), body)
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(os.Getenv(fetchClientDir), "sent"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Minute)
}

// A dispatch SIGKILLed right after it sent its FetchTask, whose call Gitea
// handles only once the process is gone (a busy machine), still has the call
// attributed to it: the endpoint it came to was given to it alone
// (giteaEndpoints), so no lookup races the process's end. Here Gitea is held
// until the process is reaped. (Whether Gitea then claims a task for the
// dead process depends on whether connect-go sees the connection's end
// first; the verdict's side of it is TestCutClaim's.)
func TestCallOfAKilledProcessIsAttributed(t *testing.T) {
	ctx := context.Background()
	g, err := StartGitea(ctx, GiteaOptions{ZombieTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	reg, err := g.Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Token: g.RegistrationToken, Name: "linux", Labels: []string{"ubuntu-latest"}}))
	if err != nil {
		t.Fatal(err)
	}
	g.Queue("org/repo", "job", []string{"ubuntu-latest"})
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fleet := NewFleet([]string{"GDR_GITEA_URL=" + g.URL, fetchClientEnv + "=1", fetchClientDir + "=" + dir,
		fetchClientEnv + "_UUID=" + reg.Msg.GetRunner().GetUuid(), fetchClientEnv + "_TOKEN=" + reg.Msg.GetRunner().GetToken()}, dir, 1)
	defer fleet.Close(time.Second)
	fleet.SetEndpoints(giteaEndpoints(g))

	g.mu.Lock() // Gitea busy: no call is handled
	held := true
	defer func() {
		if held {
			g.mu.Unlock()
		}
	}()
	go func() { _ = fleet.Run("dispatch", bin, nil, "-test.run=^TestFetchClientProcess$") }()
	waitFor(t, "the client's FetchTask sent", func() bool { _, err := os.Stat(filepath.Join(dir, "sent")); return err == nil })
	if !fleet.KillRandom() {
		t.Fatal("no process of the fleet to kill")
	}
	waitFor(t, "the client reaped", func() bool { return len(fleet.Lives("dispatch")) == 1 })
	g.mu.Unlock()
	held = false
	waitFor(t, "its FetchTask answered", func() bool { return len(g.CallLog()) == 1 })

	// The fault happened: the client was SIGKILLed and reaped before Gitea
	// answered its call.
	lives, calls := fleet.Lives("dispatch"), g.CallLog()
	if !lives[0].Killed {
		t.Fatalf("the client's life %+v: not killed", lives[0])
	}
	if len(calls) != 1 || calls[0].Method != "FetchTask" || calls[0].Answered.Before(lives[0].Ended) {
		t.Fatalf("calls %+v; want one FetchTask, answered after its client ended at %s", calls, clock(lives[0].Ended))
	}
	// The outcome: the call is the killed process's.
	if calls[0].Endpoint == "" || calls[0].Endpoint != lives[0].Endpoint {
		t.Errorf("the FetchTask came to %q, want the killed client's own endpoint %q", calls[0].Endpoint, lives[0].Endpoint)
	}
	if kind := fleet.KindOf(calls[0].Endpoint); kind != "dispatch" {
		t.Errorf("KindOf(%q) = %q, want dispatch", calls[0].Endpoint, kind)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 30 s", strings.TrimSpace(what))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
