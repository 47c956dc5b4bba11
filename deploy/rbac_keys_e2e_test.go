//go:build e2e

package deploy

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/installsecrets"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

// keysAccount is the keys Job's ServiceAccount (templates/keys.yaml).
const keysAccount = "gitea-dynamic-runner-keys"

// TestE2ERBACKeys applies the chart's keys RBAC (identity ca, pools registered from a token) to
// a real API server and runs the keys Job's code (installsecrets.Ensure) as its ServiceAccount,
// impersonated, through every path the Job takes: the install (everything made), a second run
// (everything kept), the operator's CA rotation (the bundle updated, the gateway's certificate
// renewed) and a pool added (its registration added, with a real Gitea). Every call is allowed,
// and every grant of the Role, down to its resource names, is used by some path (the audit log:
// a grant no path needs fails). Then what the Job must never do is refused: read the NATS
// users' or the operator's Secrets, list or watch Secrets, change the keys or the CA, delete
// anything, and anything at all in the executors' namespace.
func TestE2ERBACKeys(t *testing.T) {
	p := plane.Plane(t)
	if p.AuditLog() == "" {
		t.Fatal("the control plane runs without an audit log")
	}
	ns, jobs := p.Namespace(t), p.Namespace(t)
	admin := p.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	vals := map[string]any{"identity": "ca", "gitea": map[string]any{"registrationTokenSecret": "gdr-registration-token"},
		"executors": map[string]any{"namespace": jobs}}
	var keysDocs []doc
	for _, d := range mustRenderChart(t, ns, vals) {
		if d.name() == keysAccount {
			keysDocs = append(keysDocs, d)
		}
	}
	objs := rbacDocs(t, keysDocs)
	if len(objs.accounts) != 1 || len(objs.roles) != 1 || len(objs.roleBindings) != 1 || len(objs.clusterRoles)+len(objs.clusterRoleBindings) != 0 {
		t.Fatalf("the chart's keys RBAC: %d ServiceAccounts, %d Roles, %d RoleBindings, %d cluster-wide objects; want 1, 1, 1, 0",
			len(objs.accounts), len(objs.roles), len(objs.roleBindings), len(objs.clusterRoles)+len(objs.clusterRoleBindings))
	}
	applyRBAC(ctx, t, admin, objs)
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gdr-config"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gdr-nats-dispatch", "gdr-registration-token"} { // the operator's
		if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
			Data: map[string][]byte{"x": []byte("operator's")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	g := giteaenv.Start(t, giteaenv.Options{})
	keys := impersonating(t, p, ns, keysAccount)
	owner, err := keys.CoreV1().ConfigMaps(ns).Get(ctx, "gdr-config", metav1.GetOptions{}) // GDR_KEYS_OWNER, as the Job reads it
	if err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	opt := installsecrets.Options{Namespace: ns, CA: true, TrustDomain: td, GatewayID: spiffeid.RequireFromPath(td, "/gateway"),
		Random: rand.Reader, Owner: &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID},
		Runners: &installsecrets.Runners{GiteaURL: g.URL, Token: g.RegistrationToken(t), Name: "gdr",
			Pools: runnerpool.Pools{{Name: "linux", Labels: []string{"ubuntu-latest"}, Credentials: "/var/lib/gitea-dynamic-runner/linux.json"}},
			HTTP:  &http.Client{Timeout: 30 * time.Second}}}
	ensure := func(what string) installsecrets.Report {
		t.Helper()
		report, err := installsecrets.Ensure(ctx, keys, opt)
		if err != nil {
			t.Fatalf("%s, as %s: %v", what, keysAccount, err)
		}
		return report
	}
	t.Logf("install: %v", ensure("the install"))
	t.Logf("again: %v", ensure("a second run"))
	// The operator rotates the CA (deploy/REFERENCE.md, "Helm values"): a new one in gdr-identity-ca.
	ca, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	caSecret, err := admin.CoreV1().Secrets(ns).Get(ctx, installsecrets.CA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caSecret.Data = map[string][]byte{installsecrets.CACert: certPEM, installsecrets.CAKey: keyPEM}
	if _, err := admin.CoreV1().Secrets(ns).Update(ctx, caSecret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("CA rotated: %v", ensure("the run after a CA rotation"))
	// ... and, after the longest job, drops the old root from the bundle: the gateway's
	// certificate, of the old CA, is renewed under the new one.
	bundle, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, installsecrets.Bundle, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bundle.Data = map[string]string{installsecrets.BundleFile: string(certPEM)}
	if _, err := admin.CoreV1().ConfigMaps(ns).Update(ctx, bundle, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if report := ensure("the run after the old root was dropped"); !slices.ContainsFunc(report, func(l string) bool {
		return strings.HasPrefix(l, "Secret "+installsecrets.GatewaySVID) && !strings.HasSuffix(l, "kept")
	}) {
		t.Fatalf("the gateway's certificate was not renewed under the new root: %v", report)
	}
	opt.Runners.Pools = append(opt.Runners.Pools, runnerpool.Pool{Name: "arm", Labels: []string{"arm64"}, Credentials: "/var/lib/gitea-dynamic-runner/arm.json"})
	t.Logf("pool added: %v", ensure("the run after a pool was added"))

	// Every grant used, down to its resource names ("*": a grant of any name, which create is);
	// no call refused.
	type call struct{ verb, resource, name string }
	granted := map[call]bool{}
	for _, r := range objs.roles[0].Rules {
		for _, res := range r.Resources {
			for _, v := range r.Verbs {
				if len(r.ResourceNames) == 0 {
					granted[call{v, res, "*"}] = true
				}
				for _, n := range r.ResourceNames {
					granted[call{v, res, n}] = true
				}
			}
		}
	}
	used := map[call]bool{}
	user := serviceAccountUser(ns, keysAccount)
	for _, e := range readAudit(ctx, t, p, admin, ns) {
		if e.ImpersonatedUser == nil || e.ImpersonatedUser.Username != user {
			continue
		}
		if e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
			t.Errorf("refused: %s %s (a grant the keys Job needs is missing)", e.Verb, e.RequestURI)
		}
		if e.ObjectRef == nil || e.ObjectRef.Namespace != ns {
			t.Errorf("a call outside the release's namespace: %s %s", e.Verb, e.RequestURI)
			continue
		}
		c := call{e.Verb, e.ObjectRef.Resource, e.ObjectRef.Name}
		if e.Verb == "create" {
			c.name = "*"
		}
		used[c] = true
		if !granted[c] && !granted[call{c.verb, c.resource, "*"}] {
			t.Errorf("used without a grant of its own: %v", c)
		}
	}
	for g := range granted {
		if !used[g] {
			t.Errorf("granted, never used by any path: %v", g)
		}
	}
	t.Logf("%s used %d grants: %v", keysAccount, len(used), used)

	// What it must never do.
	secrets, jobSecrets := keys.CoreV1().Secrets(ns), keys.CoreV1().Secrets(jobs)
	for what, call := range map[string]func() error{
		"get the NATS user's Secret": func() error { _, err := secrets.Get(ctx, "gdr-nats-dispatch", metav1.GetOptions{}); return err },
		"get the registration token": func() error {
			_, err := secrets.Get(ctx, "gdr-registration-token", metav1.GetOptions{})
			return err
		},
		"list Secrets":  func() error { _, err := secrets.List(ctx, metav1.ListOptions{}); return err },
		"watch Secrets": func() error { w, err := secrets.Watch(ctx, metav1.ListOptions{}); stop(w); return err },
		"update the keys": func() error {
			_, err := secrets.Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: installsecrets.Keys}}, metav1.UpdateOptions{})
			return err
		},
		"update the CA": func() error {
			_, err := secrets.Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: installsecrets.CA}}, metav1.UpdateOptions{})
			return err
		},
		"delete the CA":   func() error { return secrets.Delete(ctx, installsecrets.CA, metav1.DeleteOptions{}) },
		"delete the keys": func() error { return secrets.Delete(ctx, installsecrets.Keys, metav1.DeleteOptions{}) },
		"patch the verification keys": func() error {
			_, err := keys.CoreV1().ConfigMaps(ns).Patch(ctx, installsecrets.VerifyKeys, "application/merge-patch+json", []byte(`{"data":{"x":"y"}}`), metav1.PatchOptions{})
			return err
		},
		"create a Secret in the executors' namespace": func() error {
			_, err := jobSecrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gdr-x"}}, metav1.CreateOptions{})
			return err
		},
		"create a Pod": func() error {
			_, err := keys.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}}}, metav1.CreateOptions{})
			return err
		},
	} {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s as %s: %v, want forbidden", what, keysAccount, err)
		}
	}
	if _, err := admin.CoreV1().Secrets(ns).Get(ctx, installsecrets.CA, metav1.GetOptions{}); err != nil {
		t.Fatal(fmt.Errorf("the CA after the refused calls: %w", err))
	}
}

// stop stops a watch that was allowed (which the test then reports).
func stop(w interface{ Stop() }) {
	if w != nil {
		w.Stop()
	}
}
