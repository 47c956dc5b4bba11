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
	bundlev1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/bundle/v1"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	svidv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/svid/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/spiremint"
)

// TestE2EMintOverTCPAsAnAdminID is the least-privilege path deploy/REFERENCE.md
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
	spire := spireenv.Start(t, spireenv.WithShippedPolicy(t, "../../deploy/spire", map[string]any{"minters": []string{handleID.String()}}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	local := spiremint.New(spire.Conn())
	maxTTL := shippedMaxTTL(t)
	task := spiffeid.RequireFromPath(trust, "/repo/alice/repo/task/7")

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

// TestE2EShippedPolicyLetsRegistrarsManageTaskEntriesOnly runs a real
// spire-server with deploy/spire's authorization policy and connects as the
// pod backend does (ClientConn over TCP, with its own SVID): handle's and
// recover's IDs, which are not admins, may create, read and delete task
// entries (entry ID under the prefix, a /repo/ ID of the trust domain, an
// agent parent, a pod-uid selector and the executors' namespace), and nothing
// else: not an entry for a Pod of another namespace, not an entry for the
// gateway's ID or another trust domain, not an admin entry, not an entry the
// operator made, no bundle write, no mint. Another caller may do none of it.
func TestE2EShippedPolicyLetsRegistrarsManageTaskEntriesOnly(t *testing.T) {
	trust := spiffeid.RequireTrustDomainFromString(spireenv.TrustDomain)
	handleID := spiffeid.RequireFromPath(trust, "/gitea-dynamic-runner/handle-pod")
	spire := spireenv.Start(t, spireenv.WithShippedPolicy(t, "../../deploy/spire", map[string]any{"registrars": []string{handleID.String()}}))
	prefix := shippedEntryIDPrefix(t)
	jobsNS := shippedExecutorNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	local := spiremint.New(spire.Conn())
	// An entry the operator made on the admin socket (the gateway's): its ID
	// is SPIRE's, not under the prefix.
	gatewayID := spiffeid.RequireFromPath(trust, "/gitea-dynamic-runner/gateway")
	agent := &types.SPIFFEID{TrustDomain: trust.Name(), Path: "/spire/agent/k8s_psat/gdr/node-1"}
	// A task entry expires as the pod backend's do: the job timeout plus its margin from now,
	// at most the policy's longest TTL.
	maxTTL := shippedMaxTTL(t)
	expires := time.Now().Add(maxTTL).Unix()
	entry := func(id string, spiffeID *types.SPIFFEID, edit ...func(*types.Entry)) *types.Entry {
		e := &types.Entry{Id: id, SpiffeId: spiffeID, ParentId: agent, ExpiresAt: expires,
			Selectors: []*types.Selector{{Type: "k8s", Value: "ns:" + jobsNS}, {Type: "k8s", Value: "pod-uid:0f8e"}}}
		for _, f := range edit {
			f(e)
		}
		return e
	}
	operator, err := spire.Entries().BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{
		entry("", &types.SPIFFEID{TrustDomain: trust.Name(), Path: gatewayID.Path()}, func(e *types.Entry) {
			e.Selectors = []*types.Selector{{Type: "k8s", Value: "sa:gateway"}}
		})}})
	if err != nil || operator.Results[0].Status.Code != 0 {
		t.Fatalf("the operator's entry: %v %v", operator, err)
	}
	operatorEntry := operator.Results[0].Entry.Id

	as := func(t *testing.T, caller spiffeid.ID) *grpc.ClientConn {
		t.Helper()
		svid, bundle, err := local.MintX509SVID(ctx, caller, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv("SPIFFE_ENDPOINT_SOCKET", workloadAPI(t, svid, bundle))
		conn, closeConn, err := spiremint.ClientConn(spire.Addr, trust)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = closeConn() })
		return conn
	}
	task := &types.SPIFFEID{TrustDomain: trust.Name(), Path: "/repo/alice/repo/task/7"}
	taskEntryID := prefix + "0123456789abcdef0123456789abcdef"
	denied := func(t *testing.T, what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: err = %v, want PermissionDenied", what, err)
		}
	}
	create := func(c entryv1.EntryClient, e *types.Entry) error {
		_, err := c.BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{e}})
		return err
	}

	t.Run("handle", func(t *testing.T) {
		conn := as(t, handleID)
		c := entryv1.NewEntryClient(conn)
		resp, err := c.BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{entry(taskEntryID, task)}})
		if err != nil || resp.Results[0].Status.Code != 0 {
			t.Fatalf("a task entry: %v %v", resp, err)
		}
		if got, err := c.GetEntry(ctx, &entryv1.GetEntryRequest{Id: taskEntryID}); err != nil || got.SpiffeId.Path != task.Path {
			t.Fatalf("read the task entry back: %v %v", got, err)
		}
		for _, tc := range []struct {
			name string
			e    *types.Entry
		}{
			{"the gateway's ID", entry(prefix+"1", &types.SPIFFEID{TrustDomain: trust.Name(), Path: gatewayID.Path()})},
			{"another trust domain", entry(prefix+"2", &types.SPIFFEID{TrustDomain: "evil.example.org", Path: task.Path})},
			{"an entry ID outside the prefix", entry("mine-3", task)},
			{"no entry ID (SPIRE would choose one)", entry("", task)},
			{"an admin entry", entry(prefix+"4", task, func(e *types.Entry) { e.Admin = true })},
			{"a downstream entry", entry(prefix+"5", task, func(e *types.Entry) { e.Downstream = true })},
			{"a parent that is no agent", entry(prefix+"6", task, func(e *types.Entry) { e.ParentId = &types.SPIFFEID{TrustDomain: trust.Name(), Path: gatewayID.Path()} })},
			{"a selector other than pod-uid", entry(prefix+"7", task, func(e *types.Entry) {
				e.Selectors = []*types.Selector{{Type: "k8s", Value: "ns:" + jobsNS}, {Type: "k8s", Value: "sa:gateway"}}
			})},
			{"a third selector", entry(prefix+"8", task, func(e *types.Entry) {
				e.Selectors = append(e.Selectors, &types.Selector{Type: "unix", Value: "uid:0"})
			})},
			{"no namespace selector", entry(prefix+"12", task, func(e *types.Entry) { e.Selectors = e.Selectors[1:] })},
			{"another namespace (the control plane's)", entry(prefix+"13", task, func(e *types.Entry) {
				e.Selectors[0].Value = "ns:gitea-dynamic-runner"
			})},
			{"two pod-uid selectors", entry(prefix+"14", task, func(e *types.Entry) {
				e.Selectors = []*types.Selector{{Type: "k8s", Value: "pod-uid:0f8e"}, {Type: "k8s", Value: "pod-uid:0f8f"}}
			})},
			{"DNS names", entry(prefix+"9", task, func(e *types.Entry) { e.DnsNames = []string{"gateway"} })},
			// The SVIDs' and the entry's lifetimes are bounded: a stolen registrar cannot make
			// an identity that outlives the longest job.
			{"an X509-SVID TTL over the policy's", entry(prefix+"15", task, func(e *types.Entry) { e.X509SvidTtl = int32(maxTTL.Seconds()) + 1 })},
			{"a JWT-SVID TTL over the policy's", entry(prefix+"16", task, func(e *types.Entry) { e.JwtSvidTtl = int32(maxTTL.Seconds()) + 1 })},
			{"no expiry", entry(prefix+"17", task, func(e *types.Entry) { e.ExpiresAt = 0 })},
			{"an expiry a day away", entry(prefix+"18", task, func(e *types.Entry) { e.ExpiresAt = time.Now().Add(24 * time.Hour).Unix() })},
			{"an expiry past the policy's TTL and clock skew", entry(prefix+"19", task, func(e *types.Entry) {
				e.ExpiresAt = time.Now().Add(maxTTL + shippedClockSkew(t) + time.Minute).Unix()
			})},
			{"an SVID stored by an SVIDStore plugin", entry(prefix+"20", task, func(e *types.Entry) { e.StoreSvid = true })},
		} {
			denied(t, tc.name, create(c, tc.e))
		}
		// One bad entry in a batch refuses the batch.
		_, err = c.BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{
			entry(prefix+"10", task), entry(prefix+"11", &types.SPIFFEID{TrustDomain: trust.Name(), Path: gatewayID.Path()})}})
		denied(t, "a batch with the gateway's ID in it", err)
		// The longest TTLs and expiry the policy allows (the expiry as late as the clock skew
		// lets it be, less a minute for this test's own delays) are allowed.
		longest := prefix + "21"
		resp, err = c.BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{entry(longest, task, func(e *types.Entry) {
			e.X509SvidTtl, e.JwtSvidTtl = int32(maxTTL.Seconds()), int32(maxTTL.Seconds())
			e.ExpiresAt = time.Now().Add(maxTTL + shippedClockSkew(t) - time.Minute).Unix()
			e.Selectors[1].Value = "pod-uid:0f90"
		})}})
		if err != nil || resp.Results[0].Status.Code != 0 {
			t.Fatalf("a task entry with the longest TTLs and expiry: %v %v", resp, err)
		}
		if del, err := c.BatchDeleteEntry(ctx, &entryv1.BatchDeleteEntryRequest{Ids: []string{longest}}); err != nil || del.Results[0].Status.Code != 0 {
			t.Fatalf("delete %s: %v %v", longest, del, err)
		}
		_, err = c.GetEntry(ctx, &entryv1.GetEntryRequest{Id: operatorEntry})
		denied(t, "reading the operator's entry", err)
		_, err = c.BatchDeleteEntry(ctx, &entryv1.BatchDeleteEntryRequest{Ids: []string{operatorEntry}})
		denied(t, "deleting the operator's entry", err)
		_, err = c.ListEntries(ctx, &entryv1.ListEntriesRequest{})
		denied(t, "listing entries", err)
		_, err = bundlev1.NewBundleClient(conn).AppendBundle(ctx, &bundlev1.AppendBundleRequest{})
		denied(t, "a bundle write", err)
		_, err = svidv1.NewSVIDClient(conn).MintX509SVID(ctx, &svidv1.MintX509SVIDRequest{})
		denied(t, "a mint", err)
		del, err := c.BatchDeleteEntry(ctx, &entryv1.BatchDeleteEntryRequest{Ids: []string{taskEntryID}})
		if err != nil || del.Results[0].Status.Code != 0 {
			t.Fatalf("delete the task entry: %v %v", del, err)
		}
		// The refusals changed nothing: the operator's entry is the only one left.
		if all := spire.AllEntries(t); len(all) != 1 || all[0].Id != operatorEntry {
			t.Fatalf("entries left: %v", all)
		}
	})
	t.Run("another caller", func(t *testing.T) {
		denied(t, "a task entry", create(entryv1.NewEntryClient(as(t, gatewayID)), entry(taskEntryID, task)))
	})
}

// shippedData is deploy/spire's policy data for this project.
func shippedData(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/spire/policy_data.json")
	if err != nil {
		t.Fatal(err)
	}
	var data struct {
		GDR map[string]any `json:"gitea_dynamic_runner"`
	}
	if err := json.Unmarshal(raw, &data); err != nil {
		t.Fatal(err)
	}
	return data.GDR
}

// shippedMaxTTL is the longest task SVID the shipped policy lets a minter ask for.
func shippedMaxTTL(t *testing.T) time.Duration {
	t.Helper()
	return time.Duration(shippedData(t)["max_ttl_seconds"].(float64)) * time.Second
}

// shippedClockSkew is how far the shipped policy lets an entry's expiry run past its longest
// TTL from the server's clock: the registrar's clock may be ahead.
func shippedClockSkew(t *testing.T) time.Duration {
	t.Helper()
	s, ok := shippedData(t)["max_clock_skew_seconds"].(float64)
	if !ok {
		t.Fatal("policy_data.json has no max_clock_skew_seconds")
	}
	return time.Duration(s) * time.Second
}

// shippedEntryIDPrefix is the prefix of the entry IDs the shipped policy lets registrars manage.
func shippedEntryIDPrefix(t *testing.T) string {
	t.Helper()
	return shippedData(t)["entry_id_prefix"].(string)
}

// shippedExecutorNamespace is the one namespace of the shipped policy data's
// executor_namespaces, where the shipped manifests run executors.
func shippedExecutorNamespace(t *testing.T) string {
	t.Helper()
	ns, _ := shippedData(t)["executor_namespaces"].([]any)
	if len(ns) != 1 {
		t.Fatalf("policy_data.json executor_namespaces = %v, want one namespace", ns)
	}
	return ns[0].(string)
}
