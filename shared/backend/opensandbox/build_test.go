package opensandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/spiremint/spiremintest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

func deps(t *testing.T) backend.Deps {
	t.Helper()
	keys, err := taskassignment.NewKeys("gitea-dynamic-runner.io")
	if err != nil {
		t.Fatal(err)
	}
	return backend.Deps{Keys: keys, TrustDomain: td, Log: slog.New(slog.DiscardHandler), Pools: runnerpool.Pools{{
		Name: "sandbox", Labels: []string{"sandbox"}, Backend: taskassignment.BackendOpenSandbox, Capacity: 1,
		JobTimeout: runnerpool.Duration(45 * time.Minute),
		Profile:    json.RawMessage(`{"image":"registry.example.org/runner:1","entrypoint":["/runner"],"resourceLimits":{"cpu":"1"}}`),
	}}}
}

// TestOpenSandboxSVIDsFromSPIRE: with GDR_OPENSANDBOX_SPIRE_SERVER, the
// sandbox's SVID is minted by that SPIRE Server, for the task's SPIFFE ID,
// for the pool's job timeout, and its bundle is SPIRE's.
func TestOpenSandboxSVIDsFromSPIRE(t *testing.T) {
	spire := spiremintest.New(t, td)
	sandboxes := sandboxapitest.New(t, sandboxapitest.WithAPIKey("k"))
	d := deps(t)
	b, release, err := opensandbox.Build(backend.BuildSettings{OpenSandboxSettings: backend.OpenSandboxSettings{
		OpenSandboxURL: sandboxes.URL, OpenSandboxKey: "k", OpenSandboxSPIRE: "unix:" + spire.Socket,
	}}, d)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := release(); err != nil {
			t.Error(err)
		}
	}()
	id, err := taskidentity.New(td, "alice/repo", "build", 7)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendOpenSandbox, taskassignment.Task{ID: 7, Pool: "sandbox"}, id)
	if err != nil {
		t.Fatal(err)
	}
	boot, err := bootstrap.New(bytes.Repeat([]byte{1}, 32), "https://gateway.example.org", spiffeid.RequireFromPath(td, "/gateway"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := boot.Environment(a)
	if err != nil {
		t.Fatal(err)
	}
	e, err := b.Create(context.Background(), a, executor.LaunchSpec{Metadata: d.Keys.Metadata(a), Environment: env})
	if err != nil {
		t.Fatal(err)
	}
	sb, ok := sandboxes.Sandbox(e.Name)
	if !ok {
		t.Fatal("no sandbox")
	}
	calls := spire.Calls()
	if len(calls) != 1 || calls[0].ID.String() != id.SPIFFEID || calls[0].TTL != 45*time.Minute {
		t.Fatalf("SPIRE was asked %+v, want one SVID for %s for 45m", calls, id.SPIFFEID)
	}
	svid, err := x509svid.Parse([]byte(sb.Env[bootstrap.EnvSVIDCert]), []byte(sb.Env[bootstrap.EnvSVIDKey]))
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID.String() != id.SPIFFEID {
		t.Fatalf("SVID for %s", svid.ID)
	}
	block, rest := pem.Decode([]byte(sb.Env[bootstrap.EnvSVIDBundle]))
	if block == nil || !bytes.Equal(block.Bytes, spire.CA.Raw) || len(bytes.TrimSpace(rest)) != 0 {
		t.Fatal("the bundle handed over is not SPIRE's")
	}
	for k, v := range sb.Metadata {
		if strings.Contains(v, "PRIVATE") || strings.Contains(v, "BEGIN") {
			t.Fatalf("metadata %s holds SVID material", k)
		}
	}
}

// TestOpenSandboxSPIREIsLazy: building the backend connects nothing, so
// recover (which never mints) needs neither the server nor an SVID.
func TestOpenSandboxSPIREIsLazy(t *testing.T) {
	sandboxes := sandboxapitest.New(t, sandboxapitest.WithAPIKey("k"))
	for _, addr := range []string{"spire-server.spire.svc:8081", "unix:/nonexistent/api.sock"} {
		b, release, err := opensandbox.Build(backend.BuildSettings{OpenSandboxSettings: backend.OpenSandboxSettings{
			OpenSandboxURL: sandboxes.URL, OpenSandboxKey: "k", OpenSandboxSPIRE: addr}}, deps(t))
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		if _, err := b.RecoverAssignments(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := release(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenSandboxSPIRESettings(t *testing.T) {
	sandboxes := sandboxapitest.New(t, sandboxapitest.WithAPIKey("k"))
	for _, tt := range []struct{ spire, caDir, want string }{
		{"127.0.0.1:8081", t.TempDir(), "set one, not both"},
		{"spire-server", "", "neither host:port nor unix:<path>"},
		{"unix:", "", "no socket path"},
	} {
		_, _, err := opensandbox.Build(backend.BuildSettings{CADir: tt.caDir, OpenSandboxSettings: backend.OpenSandboxSettings{
			OpenSandboxURL: sandboxes.URL, OpenSandboxKey: "k", OpenSandboxSPIRE: tt.spire}}, deps(t))
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "GDR_") {
			t.Errorf("%q, %q: err = %v, want one naming the variable and %q", tt.spire, tt.caDir, err, tt.want)
		}
	}
}
