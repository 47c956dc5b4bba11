//go:build e2e

package spiremint_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/spiremint"
)

// TestE2EMintOverTCPAsAnAdminID is the least-privilege path deploy/README
// documents: handle reaches the SPIRE Server's TCP API with its own SVID
// (from the Workload API) whose ID is in the server's admin_ids, with no
// admin socket mounted. A caller whose ID is not an admin is refused, and
// the error says so and stays transient.
func TestE2EMintOverTCPAsAnAdminID(t *testing.T) {
	handleID := spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString(spireenv.TrustDomain), "/gitea-dynamic-runner/handle")
	spire := spireenv.Start(t, spireenv.WithAdminIDs(handleID))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The SVIDs the Workload API hands the caller, as an agent would: the
	// server's own CA signs them (minted here on the admin socket).
	local := spiremint.New(spire.Conn())

	for _, tt := range []struct {
		name   string
		caller spiffeid.ID
		admin  bool
	}{
		{"an admin ID", handleID, true},
		{"another ID", spiffeid.RequireFromPath(spire.TrustDomain, "/gitea-dynamic-runner/recover"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			svid, bundle, err := local.MintX509SVID(ctx, tt.caller, 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			t.Setenv("SPIFFE_ENDPOINT_SOCKET", workloadAPI(t, svid, bundle))
			r, err := spiremint.Dial(spire.Addr, spire.TrustDomain)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			sandbox := spiffeid.RequireFromPath(spire.TrustDomain, "/repo/alice/repo/task/7")
			got, gotBundle, err := r.MintX509SVID(ctx, sandbox, 30*time.Minute)
			if !tt.admin {
				if err == nil || status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "refused this caller") {
					t.Fatalf("a caller outside admin_ids: err = %v, want PermissionDenied worded for an operator", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if id, _, err := x509svid.Verify(got.Certificates, gotBundle); err != nil || id != sandbox {
				t.Fatalf("verify: %v %v", id, err)
			}
			if !gotBundle.Equal(bundle) {
				t.Fatal("the bundle over TCP is not the server's")
			}
		})
	}
}

// workloadAPI serves svid and bundle as a SPIFFE Workload API on a unix
// socket and returns its address for SPIFFE_ENDPOINT_SOCKET.
func workloadAPI(t *testing.T, svid *x509svid.SVID, bundle *x509bundle.Bundle) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gdr-wl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var chain, roots []byte
	for _, c := range svid.Certificates {
		chain = append(chain, c.Raw...)
	}
	for _, c := range bundle.X509Authorities() {
		roots = append(roots, c.Raw...)
	}
	key, err := x509.MarshalPKCS8PrivateKey(svid.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	workload.RegisterSpiffeWorkloadAPIServer(g, &fakeAgent{resp: &workload.X509SVIDResponse{Svids: []*workload.X509SVID{{
		SpiffeId: svid.ID.String(), X509Svid: chain, X509SvidKey: key, Bundle: roots,
	}}}})
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return "unix://" + sock
}

type fakeAgent struct {
	workload.UnimplementedSpiffeWorkloadAPIServer
	resp *workload.X509SVIDResponse
}

func (a *fakeAgent) FetchX509SVID(_ *workload.X509SVIDRequest, s grpc.ServerStreamingServer[workload.X509SVIDResponse]) error {
	if err := s.Send(a.resp); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// TestE2EShippedPolicyLetsHandleMintTaskIDsOnly runs a real spire-server
// with deploy/spire's authorization policy: handle's SPIFFE ID, which is not
// an admin, may mint task identities over TCP for at most the policy's TTL,
// and nothing else: not the gateway's identity, not a longer SVID, no other
// admin API. Another caller may not mint at all.
func TestE2EShippedPolicyLetsHandleMintTaskIDsOnly(t *testing.T) {
	trust := spiffeid.RequireTrustDomainFromString(spireenv.TrustDomain)
	handleID := spiffeid.RequireFromPath(trust, "/gitea-dynamic-runner/handle-opensandbox")
	dir := t.TempDir()
	raw, err := os.ReadFile("../../deploy/spire/policy_data.json")
	if err != nil {
		t.Fatal(err)
	}
	var data map[string]any
	if err := json.Unmarshal(raw, &data); err != nil {
		t.Fatal(err)
	}
	gdr := data["gitea_dynamic_runner"].(map[string]any)
	gdr["minters"], gdr["trust_domain"] = []string{handleID.String()}, trust.Name()
	raw, err = json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	dataPath := filepath.Join(dir, "policy_data.json")
	if err := os.WriteFile(dataPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	regoPath, err := filepath.Abs("../../deploy/spire/policy.rego")
	if err != nil {
		t.Fatal(err)
	}
	// The local socket stays admin under the policy: Start's readiness
	// check (CountEntries) proves it.
	spire := spireenv.Start(t, spireenv.WithAuthorizationPolicy(regoPath, dataPath))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	local := spiremint.New(spire.Conn())
	task := spiffeid.RequireFromPath(trust, "/repo/alice/repo/task/7")
	maxTTL := time.Duration(gdr["max_ttl_seconds"].(float64)) * time.Second

	as := func(t *testing.T, caller spiffeid.ID) (*spiremint.Remote, *grpc.ClientConn) {
		t.Helper()
		svid, bundle, err := local.MintX509SVID(ctx, caller, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv("SPIFFE_ENDPOINT_SOCKET", workloadAPI(t, svid, bundle))
		r, err := spiremint.Dial(spire.Addr, trust)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		src, err := workloadapi.NewX509Source(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		conn, err := grpc.NewClient(spire.Addr, grpc.WithTransportCredentials(credentials.NewTLS(
			tlsconfig.MTLSClientConfig(src, src, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(trust, "/spire/server"))))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return r, conn
	}
	denied := func(t *testing.T, what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("%s: err = %v, want PermissionDenied", what, err)
		}
	}

	t.Run("handle", func(t *testing.T) {
		r, conn := as(t, handleID)
		svid, bundle, err := r.MintX509SVID(ctx, task, maxTTL)
		if err != nil {
			t.Fatalf("a task SVID for the policy's longest TTL: %v", err)
		}
		if id, _, err := x509svid.Verify(svid.Certificates, bundle); err != nil || id != task {
			t.Fatalf("verify: %v %v", id, err)
		}
		_, _, err = r.MintX509SVID(ctx, spiffeid.RequireFromPath(trust, "/gateway"), time.Minute)
		denied(t, "the gateway's identity", err)
		_, _, err = r.MintX509SVID(ctx, spiffeid.RequireFromPath(trust, "/repository/alice/repo/task/7"), time.Minute)
		denied(t, "an identity outside /repo/", err)
		_, _, err = r.MintX509SVID(ctx, task, maxTTL+time.Second)
		denied(t, "a TTL over the policy's", err)
		_, err = entryv1.NewEntryClient(conn).CountEntries(ctx, &entryv1.CountEntriesRequest{})
		denied(t, "another admin API", err)
	})
	t.Run("another caller", func(t *testing.T) {
		r, _ := as(t, spiffeid.RequireFromPath(trust, "/gitea-dynamic-runner/recover"))
		_, _, err := r.MintX509SVID(ctx, task, time.Minute)
		denied(t, "a task SVID", err)
	})
}
