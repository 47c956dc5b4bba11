//go:build e2e

package spiremint_test

import (
	"context"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
