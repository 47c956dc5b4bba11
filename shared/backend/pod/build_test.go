package pod

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestBuildSPIREServer: Build takes the SPIRE Server's TCP API or a unix socket, connects
// nothing yet, and refuses any other form naming the variable.
func TestBuildSPIREServer(t *testing.T) {
	deps := buildDeps(t)
	for _, tc := range []struct{ addr, err string }{
		{"spire-server.spire.svc:8081", ""},
		{"unix:/run/spire/server-sockets/api.sock", ""},
		{"/run/spire/server-sockets/api.sock", `GDR_SPIRE_SERVER: spiremint: SPIRE Server address "/run/spire/server-sockets/api.sock" is neither host:port nor unix:<path>`},
		{"", "GDR_SPIRE_SERVER is required"},
	} {
		b, closeFn, err := Build(backend.BuildSettings{PodSettings: backend.PodSettings{SPIREServer: tc.addr, ClusterName: "c", KubeNamespace: "ci", PodIdentity: backend.PodIdentityMinted}}, deps)
		if tc.err == "" {
			if err != nil || b == nil {
				t.Errorf("%q: Build = %v", tc.addr, err)
				continue
			}
			if err := closeFn(); err != nil {
				t.Errorf("%q: close: %v", tc.addr, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: Build = %v, want an error with %q", tc.addr, err, tc.err)
		}
	}
}

// TestBuildPodIdentity: GDR_POD_IDENTITY=minted gives the backend a minter on
// the SPIRE connection, workload-api none; anything else is refused.
func TestBuildPodIdentity(t *testing.T) {
	deps := buildDeps(t)
	for _, tc := range []struct {
		identity string
		minter   bool
		err      string
	}{
		{backend.PodIdentityMinted, true, ""},
		{backend.PodIdentityWorkloadAPI, false, ""},
		{"", false, `GDR_POD_IDENTITY ""`},
	} {
		b, closeFn, err := Build(backend.BuildSettings{PodSettings: backend.PodSettings{SPIREServer: "spire:8081", ClusterName: "c", KubeNamespace: "ci", PodIdentity: tc.identity}}, deps)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: Build = %v, want an error with %q", tc.identity, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.identity, err)
		}
		if got := b.(*Backend).minter != nil; got != tc.minter {
			t.Errorf("%q: minter %v, want %v", tc.identity, got, tc.minter)
		}
		_ = closeFn()
	}
	// ca: the installation's CA mints (read at the first mint, not by Build: the folder may
	// not be there for recover), with no SPIRE Server and no cluster name.
	b, closeFn, err := Build(backend.BuildSettings{CADir: filepath.Join(t.TempDir(), "absent"), PodSettings: backend.PodSettings{KubeNamespace: "ci", PodIdentity: backend.PodIdentityCA}}, deps)
	if err != nil {
		t.Fatalf("ca: %v", err)
	}
	if pb := b.(*Backend); pb.minter == nil || pb.entries != nil {
		t.Errorf("ca: minter %v, entries %v: want the CA and no SPIRE entry client", pb.minter, pb.entries)
	}
	if err := closeFn(); err != nil {
		t.Error(err)
	}
}

// buildDeps points KUBECONFIG at an API server that is never reached (Build
// connects nothing) and returns the Deps of one pod pool.
func buildDeps(t *testing.T) backend.Deps {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	keys, err := taskassignment.NewKeys("ci.example.org")
	if err != nil {
		t.Fatal(err)
	}
	deps := backend.Deps{Keys: keys, TrustDomain: spiffeid.RequireTrustDomainFromString("ci.example.org"), Pools: runnerpool.Pools{
		{Name: "linux", Labels: []string{"x"}, Backend: taskassignment.BackendPod, Capacity: 1, Profile: json.RawMessage(testTemplate)},
	}}
	return deps
}

// TestBuildKubeClientLimits: the API client's rate limit is the settings'
// (GDR_KUBE_QPS, GDR_KUBE_BURST), not client-go's default of 5 requests per
// second, which held a warm handle to one assignment a second (five calls
// each; docs/BENCHMARKS.md, "Component rates"); a negative QPS turns the
// client's limiter off.
func TestBuildKubeClientLimits(t *testing.T) {
	deps := buildDeps(t)
	for _, tc := range []struct {
		qps   float32
		burst int
		want  float32 // the limiter's QPS; 0: none
	}{
		{50, 100, 50},
		{20, 40, 20},
		{-1, 0, 0},
		{0, 0, 5}, // the zero value: client-go's default
	} {
		s := backend.BuildSettings{CADir: t.TempDir(), PodSettings: backend.PodSettings{KubeNamespace: "ci", PodIdentity: backend.PodIdentityCA, KubeQPS: tc.qps, KubeBurst: tc.burst}}
		b, _, err := Build(s, deps)
		if err != nil {
			t.Fatalf("QPS %v burst %d: %v", tc.qps, tc.burst, err)
		}
		limiter := b.(*Backend).client.CoreV1().RESTClient().GetRateLimiter()
		switch {
		case tc.want == 0 && limiter != nil:
			t.Errorf("QPS %v: a limiter of %v QPS, want none", tc.qps, limiter.QPS())
		case tc.want != 0 && (limiter == nil || limiter.QPS() != tc.want):
			t.Errorf("QPS %v burst %d: limiter %v, want %v QPS", tc.qps, tc.burst, limiter, tc.want)
		}
	}
	// A burst below 1 with a positive QPS is a configuration error naming
	// the variable (client-go would refuse to build the client).
	for _, tc := range []struct {
		qps   float32
		burst int
		err   string
	}{{50, 0, "GDR_KUBE_BURST"}, {50, -1, "GDR_KUBE_BURST"}} {
		err := backend.CheckPod(backend.BuildSettings{CADir: "/ca", PodSettings: backend.PodSettings{KubeNamespace: "ci", PodIdentity: backend.PodIdentityCA, KubeQPS: tc.qps, KubeBurst: tc.burst}})
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("QPS %v burst %d: CheckPod = %v, want an error naming %s", tc.qps, tc.burst, err, tc.err)
		}
	}
}
