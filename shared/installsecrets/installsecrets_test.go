package installsecrets

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/installkeys"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

func options(now time.Time) Options {
	return Options{Namespace: "gdr", CA: true, TrustDomain: td, GatewayID: spiffeid.RequireFromPath(td, "/gateway"),
		Owner:  &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "gdr-config", UID: "cm-uid"},
		Random: rand.Reader, Now: func() time.Time { return now }}
}

func get(t *testing.T, c *fake.Clientset, name string) *corev1.Secret {
	t.Helper()
	s, err := c.CoreV1().Secrets("gdr").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func gatewayOf(t *testing.T, c *fake.Clientset) *x509svid.SVID {
	t.Helper()
	s := get(t, c, GatewaySVID)
	svid, err := x509svid.Parse(s.Data[GatewayCert], s.Data[GatewayKey])
	if err != nil {
		t.Fatal(err)
	}
	return svid
}

func bundleOf(t *testing.T, c *fake.Clientset) *x509bundle.Bundle {
	t.Helper()
	cm, err := c.CoreV1().ConfigMaps("gdr").Get(context.Background(), Bundle, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := x509bundle.Parse(td, []byte(cm.Data[BundleFile]))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A first run makes every object, owned by the release; the verification key is the signing
// key's; the gateway's certificate is the gateway's, verified by the bundle. A second run
// keeps every byte. No key material in the report.
func TestEnsureMakesThenKeeps(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	now := time.Now()
	report, err := Ensure(ctx, c, options(now))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Secret gdr-secrets: created", "ConfigMap gdr-assignment-verify-keys: created", "Secret gdr-identity-ca: created",
		"ConfigMap gdr-identity-bundle: created", "Secret gdr-gateway-svid: created"} {
		if !slices.Contains(report, want) {
			t.Errorf("the report lacks %q: %q", want, report)
		}
	}
	keys := get(t, c, Keys)
	if len(keys.OwnerReferences) != 1 || keys.OwnerReferences[0].UID != "cm-uid" {
		t.Errorf("owners %+v, want the release's ConfigMap", keys.OwnerReferences)
	}
	cm, err := c.CoreV1().ConfigMaps("gdr").Get(ctx, VerifyKeys, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := installkeys.VerifyKeyOf(keys.Data[installkeys.AssignmentSigningKey]); cm.Data[installkeys.VerifyKeys] != string(want) {
		t.Errorf("the verification key is not the signing key's")
	}
	gw := gatewayOf(t, c)
	if gw.ID.String() != "spiffe://ci.example.org/gateway" {
		t.Errorf("the gateway's certificate is %s", gw.ID)
	}
	if _, _, err := x509svid.Verify(gw.Certificates, bundleOf(t, c)); err != nil {
		t.Errorf("the bundle does not verify the gateway: %v", err)
	}
	var secrets []string
	for _, name := range []string{Keys, CA, GatewaySVID} {
		for _, v := range get(t, c, name).Data {
			secrets = append(secrets, string(v))
		}
	}
	again, err := Ensure(ctx, c, options(now.Add(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range again {
		if !strings.HasSuffix(line, ": kept") {
			t.Errorf("a second run: %q", line)
		}
	}
	for _, name := range []string{Keys, CA, GatewaySVID} {
		for _, v := range get(t, c, name).Data {
			if !slices.Contains(secrets, string(v)) {
				t.Errorf("Secret %s changed on the second run", name)
			}
		}
	}
	for _, line := range append(report, again...) {
		for _, s := range secrets {
			if strings.Contains(line, strings.TrimSpace(s)) {
				t.Fatalf("the report shows key material: %q", line)
			}
		}
	}
}

// The gateway's certificate is renewed with less than a third of its life left, and when the
// bundle no longer verifies it (a rotation's end: the old root dropped); a new CA put in place
// by the operator (a rotation's start) joins the bundle beside the old root, and the gateway's
// certificate of the old root stays valid meanwhile.
func TestEnsureRenewsAndRotates(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	now := time.Now()
	if _, err := Ensure(ctx, c, options(now)); err != nil {
		t.Fatal(err)
	}
	first := gatewayOf(t, c)
	report, err := Ensure(ctx, c, options(now.Add(61*24*time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(report, "Secret gdr-gateway-svid: renewed (less than a third of its life left)") || gatewayOf(t, c).Certificates[0].Equal(first.Certificates[0]) {
		t.Fatalf("at 61 of 90 days: %q", report)
	}
	renewed := gatewayOf(t, c) // minted on the real clock: the later runs are at its start

	next, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := next.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	s := get(t, c, CA)
	s.Data = map[string][]byte{CACert: cert, CAKey: key}
	if _, err := c.CoreV1().Secrets("gdr").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	report, err = Ensure(ctx, c, options(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if b := bundleOf(t, c); len(b.X509Authorities()) != 2 || !b.HasX509Authority(next.Certificate()) {
		t.Fatalf("the bundle after a new CA: %d roots (%q)", len(b.X509Authorities()), report)
	}
	if !gatewayOf(t, c).Certificates[0].Equal(renewed.Certificates[0]) {
		t.Fatalf("the gateway's certificate of the old root was replaced mid-rotation: %q", report)
	}

	cm, err := c.CoreV1().ConfigMaps("gdr").Get(ctx, Bundle, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[BundleFile] = string(pemOf(next))
	if _, err := c.CoreV1().ConfigMaps("gdr").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	report, err = Ensure(ctx, c, options(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(report, "Secret gdr-gateway-svid: renewed (not verified by the bundle)") {
		t.Fatalf("the old root dropped: %q", report)
	}
	if _, _, err := x509svid.Verify(gatewayOf(t, c).Certificates, next.Bundle()); err != nil {
		t.Fatalf("the renewed certificate is not the new root's: %v", err)
	}
}

func pemOf(ca *svidca.CA) []byte {
	cert, _, _ := ca.Marshal()
	return cert
}

// An existing gdr-secrets that lacks a key is an error naming it: Ensure never adds a key
// beside others (a signing key without its verification key would refuse the queue).
func TestEnsureRefusesAnIncompleteKeySecret(t *testing.T) {
	c := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: Keys, Namespace: "gdr"},
		Data: map[string][]byte{installkeys.PayloadKey: []byte("cGF5bG9hZA==")}})
	_, err := Ensure(context.Background(), c, options(time.Now()))
	if err == nil || !strings.Contains(err.Error(), "Secret gdr-secrets lacks") || !strings.Contains(err.Error(), installkeys.AssignmentSigningKey) ||
		strings.Contains(err.Error(), "cGF5bG9hZA") {
		t.Fatalf("Ensure = %v", err)
	}
	if _, err := Ensure(context.Background(), c, Options{Namespace: "gdr", CA: true, TrustDomain: td, GatewayID: spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString("other.org"), "/gateway")}); err == nil {
		t.Fatal("a gateway ID of another trust domain was accepted")
	}
}

// registrar is Gitea's runner service answering Register only (what the keys Job asks).
type registrar struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	mu    sync.Mutex
	names []string
}

func (r *registrar) Register(_ context.Context, req *connect.Request[runnerv1.RegisterRequest]) (*connect.Response[runnerv1.RegisterResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if req.Msg.GetToken() != "registration-token" {
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New("bad token"))
	}
	r.names = append(r.names, req.Msg.GetName())
	return connect.NewResponse(&runnerv1.RegisterResponse{Runner: &runnerv1.Runner{Id: int64(len(r.names)), Uuid: "uuid-" + req.Msg.GetName(), Token: "token-" + req.Msg.GetName(), Name: req.Msg.GetName()}}), nil
}

// The pools without a registration in gdr-runner-credentials are registered, each once, and
// added beside the ones there, which stay; a second run registers nothing; a missing token is
// an error naming the pool.
func TestEnsureRegistersThePools(t *testing.T) {
	ctx := context.Background()
	reg := &registrar{}
	mux := http.NewServeMux()
	path, h := runnerv1connect.NewRunnerServiceHandler(reg)
	mux.Handle("/api/actions"+path, http.StripPrefix("/api/actions", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	pools := runnerpool.Pools{
		{Name: "linux", Labels: []string{"ubuntu-latest"}, Credentials: "/var/lib/gitea-dynamic-runner/linux.json"},
		{Name: "build", Labels: []string{"build"}, Credentials: "/var/lib/gitea-dynamic-runner/build.json"},
	}
	c := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: RunnerCredentials, Namespace: "gdr"},
		Data: map[string][]byte{"linux.json": []byte(`{"id":7,"uuid":"kept","token":"kept-token"}`)}})
	opt := Options{Namespace: "gdr", Random: rand.Reader,
		Runners: &Runners{GiteaURL: srv.URL + "/", Token: "registration-token", Name: "gdr", Pools: pools, HTTP: srv.Client()}}
	report, err := Ensure(ctx, c, opt)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reg.names, []string{"gdr-build"}) || !slices.Contains(report, "Secret gdr-runner-credentials: pools build registered") {
		t.Fatalf("registered %v, report %q", reg.names, report)
	}
	s := get(t, c, RunnerCredentials)
	if string(s.Data["linux.json"]) != `{"id":7,"uuid":"kept","token":"kept-token"}` {
		t.Errorf("the existing registration changed: %s", s.Data["linux.json"])
	}
	var creds gitea.Credentials
	if err := json.Unmarshal(s.Data["build.json"], &creds); err != nil || creds.UUID != "uuid-gdr-build" || creds.Token != "token-gdr-build" {
		t.Fatalf("build.json: %s (%v)", s.Data["build.json"], err)
	}
	if _, err := Ensure(ctx, c, opt); err != nil || len(reg.names) != 1 {
		t.Fatalf("a second run: %v, registrations %v", err, reg.names)
	}
	for _, line := range report {
		if strings.Contains(line, "token-gdr-build") || strings.Contains(line, "registration-token") {
			t.Fatalf("the report shows a token: %q", line)
		}
	}
	opt.Runners.Token = ""
	opt.Runners.Pools = append(opt.Runners.Pools, runnerpool.Pool{Name: "gpu", Labels: []string{"gpu"}, Credentials: "/x/gpu.json"})
	if _, err := Ensure(ctx, c, opt); err == nil || !strings.Contains(err.Error(), "pool gpu is not registered and no registration token is set") {
		t.Fatalf("a new pool without a token: %v", err)
	}
}

// A renewal the API server refuses is reported as the error, never as renewed: the report is
// what happened, not what was tried.
func TestEnsureReportsARefusedRenewalAsAnError(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	now := time.Now()
	if _, err := Ensure(ctx, c, options(now)); err != nil {
		t.Fatal(err)
	}
	refused := 0
	c.PrependReactor("update", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.UpdateAction).GetObject().(*corev1.Secret).Name != GatewaySVID {
			return false, nil, nil
		}
		refused++
		return true, nil, apierrors.NewForbidden(corev1.Resource("secrets"), GatewaySVID, errors.New("refused"))
	})
	report, err := Ensure(ctx, c, options(now.Add(61*24*time.Hour)))
	if refused != 1 {
		t.Fatalf("no fault to check: %d refused updates of %s", refused, GatewaySVID)
	}
	if err == nil || !strings.Contains(err.Error(), GatewaySVID) {
		t.Fatalf("Ensure: %v, want the refused update of %s", err, GatewaySVID)
	}
	for _, line := range report {
		if strings.Contains(line, "renewed") {
			t.Fatalf("reported %q though the update was refused", line)
		}
	}
}
