// Package installsecrets makes an installation's keys in Kubernetes when they are absent and
// keeps them: the chart's keys Job runs Ensure at every install and upgrade, in place of the
// operator's `dispatch keygen`, `dispatch register` and kubectl commands.
//
// Invariants a caller relies on:
//   - a key that exists is never replaced: a new payload key would make the stored payloads
//     unreadable, a new signing key would make handle refuse what is queued, a new CA would
//     fail every running executor's SVID; rotation is docs/OPERATIONS.md's procedure, not this;
//   - what is missing is made from crypto randomness, and no key material reaches an error,
//     a log or the Report;
//   - objects it creates carry Options.Owner, so that they go with the release (uninstall
//     deletes the owner; the garbage collector deletes them), and nothing else of theirs is
//     touched but the gateway's certificate, which it renews, and the bundle, to which it adds
//     the CA's root when missing.
package installsecrets

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/installkeys"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

// The objects, as the functions' manifests read them.
const (
	// Keys holds installkeys' keys but the verification key (its files' names as keys).
	Keys = "gdr-secrets"
	// VerifyKeys holds installkeys.VerifyKeys, public, under that key.
	VerifyKeys = "gdr-assignment-verify-keys"
	// CA holds the installation's CA (ca.pem, ca-key.pem): handle alone mounts it.
	CA = "gdr-identity-ca"
	// Bundle holds bundle.pem: every root an SVID of the installation verifies with.
	Bundle = "gdr-identity-bundle"
	// GatewaySVID holds the gateway's certificate and key (tls.crt, tls.key).
	GatewaySVID = "gdr-gateway-svid"
	// RunnerCredentials holds each pool's registration, its credentials file under the file's
	// name (mounted as GDR_STATE_DIR).
	RunnerCredentials = "gdr-runner-credentials"
)

// Keys of the CA's, the bundle's and the gateway's objects.
const (
	CACert      = "ca.pem"
	CAKey       = "ca-key.pem"
	BundleFile  = svidca.BundleFile
	GatewayCert = "tls.crt"
	GatewayKey  = "tls.key"
)

// DefaultGatewayTTL is the life of the gateway's certificate; Ensure renews it when less than
// a third is left, so a keys Job at least every 60 days (every upgrade, and the chart's
// CronJob) keeps it valid.
const DefaultGatewayTTL = 90 * 24 * time.Hour

// Options say where and what.
type Options struct {
	Namespace string
	// Owner, when set, owns every object Ensure creates.
	Owner *metav1.OwnerReference
	// CA: also the installation's CA, its bundle and the gateway's certificate for GatewayID.
	CA          bool
	TrustDomain spiffeid.TrustDomain
	GatewayID   spiffeid.ID
	GatewayTTL  time.Duration
	// Runners, when set: every pool registered with Gitea (RunnerCredentials).
	Runners *Runners
	Random  io.Reader
	Now     func() time.Time
}

// Runners says how to register the pools that have no registration yet.
type Runners struct {
	GiteaURL string
	Token    string
	// Name prefixes each runner's name: <Name>-<pool>.
	Name  string
	Pools runnerpool.Pools
	HTTP  *http.Client
}

// Report says, one line per object, what Ensure did: created, kept, renewed, updated.
type Report []string

// Ensure makes what is absent and keeps what exists (package doc).
func Ensure(ctx context.Context, client kubernetes.Interface, opt Options) (Report, error) {
	switch {
	case opt.Namespace == "":
		return nil, errors.New("installsecrets: no namespace")
	case opt.CA && (opt.TrustDomain.IsZero() || !opt.GatewayID.MemberOf(opt.TrustDomain)):
		return nil, fmt.Errorf("installsecrets: the gateway's SPIFFE ID %q is not of trust domain %q", opt.GatewayID, opt.TrustDomain.Name())
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.GatewayTTL <= 0 {
		opt.GatewayTTL = DefaultGatewayTTL
	}
	e := ensurer{client: client, opt: opt}
	if err := e.keys(ctx); err != nil {
		return e.report, err
	}
	if opt.CA {
		if err := e.identity(ctx); err != nil {
			return e.report, err
		}
	}
	if opt.Runners != nil {
		if err := e.runners(ctx, *opt.Runners); err != nil {
			return e.report, err
		}
	}
	return e.report, nil
}

// runners registers with Gitea each pool RunnerCredentials lacks and adds its credentials;
// a registration there is never replaced (the pool's runner in Gitea is that one). A pool
// registered but not yet stored (the Job died in between) is registered again on the next run:
// Gitea then lists an idle runner of the first registration, which an administrator removes.
func (e *ensurer) runners(ctx context.Context, r Runners) error {
	secrets := e.client.CoreV1().Secrets(e.opt.Namespace)
	s, err := secrets.Get(ctx, RunnerCredentials, metav1.GetOptions{})
	exists := err == nil
	switch {
	case apierrors.IsNotFound(err):
		s = &corev1.Secret{ObjectMeta: e.meta(RunnerCredentials), Type: corev1.SecretTypeOpaque}
	case err != nil:
		return fmt.Errorf("Secret %s: %w", RunnerCredentials, err)
	}
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	var added []string
	for _, p := range r.Pools {
		key := filepath.Base(p.Credentials)
		if len(s.Data[key]) > 0 {
			continue
		}
		if r.Token == "" {
			return fmt.Errorf("pool %s is not registered and no registration token is set (GDR_REGISTRATION_TOKEN, the chart's gitea.registrationTokenSecret)", p.Name)
		}
		creds, err := gitea.Register(ctx, r.GiteaURL, r.HTTP, gitea.Registration{Token: r.Token, Name: r.Name + "-" + p.Name, Labels: p.Labels})
		if err != nil {
			return fmt.Errorf("pool %s: %w", p.Name, err)
		}
		data, err := gitea.EncodeCredentials(creds)
		if err != nil {
			return fmt.Errorf("pool %s: %w", p.Name, err)
		}
		s.Data[key] = data
		added = append(added, p.Name)
	}
	if len(added) == 0 {
		e.say("Secret %s: kept", RunnerCredentials)
		return nil
	}
	if exists {
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
	} else {
		_, err = secrets.Create(ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("Secret %s (pools %s registered, not stored: remove their runners in Gitea): %w", RunnerCredentials, strings.Join(added, ", "), err)
	}
	e.say("Secret %s: pools %s registered", RunnerCredentials, strings.Join(added, ", "))
	return nil
}

type ensurer struct {
	client kubernetes.Interface
	opt    Options
	report Report
}

func (e *ensurer) say(format string, a ...any) {
	e.report = append(e.report, fmt.Sprintf(format, a...))
}

func (e *ensurer) meta(name string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Name: name, Namespace: e.opt.Namespace,
		Labels: map[string]string{"app.kubernetes.io/part-of": "gitea-dynamic-runner"}}
	if e.opt.Owner != nil {
		m.OwnerReferences = []metav1.OwnerReference{*e.opt.Owner}
	}
	return m
}

// secret returns the Secret name, creating it with make's data when absent (another keys Job
// that created it first wins: its data is read back).
func (e *ensurer) secret(ctx context.Context, name string, make func() (map[string][]byte, error)) (*corev1.Secret, error) {
	secrets := e.client.CoreV1().Secrets(e.opt.Namespace)
	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		e.say("Secret %s: kept", name)
		return s, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("Secret %s: %w", name, err)
	}
	data, err := make()
	if err != nil {
		return nil, fmt.Errorf("Secret %s: %w", name, err)
	}
	s, err = secrets.Create(ctx, &corev1.Secret{ObjectMeta: e.meta(name), Type: corev1.SecretTypeOpaque, Data: data}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return e.secret(ctx, name, make)
	}
	if err != nil {
		return nil, fmt.Errorf("Secret %s: %w", name, err)
	}
	e.say("Secret %s: created", name)
	return s, nil
}

// keys ensures Keys and VerifyKeys, the latter from the former's signing key.
func (e *ensurer) keys(ctx context.Context) error {
	s, err := e.secret(ctx, Keys, func() (map[string][]byte, error) {
		all, err := installkeys.Generate(e.opt.Random)
		if err != nil {
			return nil, err
		}
		delete(all, installkeys.VerifyKeys)
		return all, nil
	})
	if err != nil {
		return err
	}
	var missing []string
	for _, k := range installkeys.Files {
		if k != installkeys.VerifyKeys && len(s.Data[k]) == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("Secret %s lacks %q: add them (deploy/README.md, install step 1), Ensure never changes an existing key", Keys, missing)
	}
	cms := e.client.CoreV1().ConfigMaps(e.opt.Namespace)
	if _, err := cms.Get(ctx, VerifyKeys, metav1.GetOptions{}); err == nil {
		e.say("ConfigMap %s: kept", VerifyKeys)
		return nil
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("ConfigMap %s: %w", VerifyKeys, err)
	}
	verify, err := installkeys.VerifyKeyOf(s.Data[installkeys.AssignmentSigningKey])
	if err != nil {
		return fmt.Errorf("Secret %s: %w", Keys, err)
	}
	_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: e.meta(VerifyKeys), Data: map[string]string{installkeys.VerifyKeys: string(verify)}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("ConfigMap %s: %w", VerifyKeys, err)
	}
	e.say("ConfigMap %s: created", VerifyKeys)
	return nil
}

// identity ensures the CA, the bundle holding its root, and a gateway certificate the bundle
// verifies, for GatewayID, with a third of its life or more left.
func (e *ensurer) identity(ctx context.Context) error {
	s, err := e.secret(ctx, CA, func() (map[string][]byte, error) {
		ca, err := svidca.New(e.opt.TrustDomain)
		if err != nil {
			return nil, err
		}
		cert, key, err := ca.Marshal()
		return map[string][]byte{CACert: cert, CAKey: key}, err
	})
	if err != nil {
		return err
	}
	ca, err := svidca.Parse(s.Data[CACert], s.Data[CAKey], e.opt.TrustDomain)
	if err != nil {
		return fmt.Errorf("Secret %s: %w", CA, err)
	}
	bundle, err := e.bundle(ctx, ca.Certificate())
	if err != nil {
		return err
	}
	return e.gateway(ctx, ca, bundle)
}

// bundle ensures Bundle holds root (created with it alone; a rotation's other roots kept).
func (e *ensurer) bundle(ctx context.Context, root *x509.Certificate) (*x509bundle.Bundle, error) {
	cms := e.client.CoreV1().ConfigMaps(e.opt.Namespace)
	rootPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw})
	cm, err := cms.Get(ctx, Bundle, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: e.meta(Bundle), Data: map[string]string{BundleFile: string(rootPEM)}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return e.bundle(ctx, root)
		}
		if err != nil {
			return nil, fmt.Errorf("ConfigMap %s: %w", Bundle, err)
		}
		e.say("ConfigMap %s: created", Bundle)
	} else if err != nil {
		return nil, fmt.Errorf("ConfigMap %s: %w", Bundle, err)
	}
	b, err := x509bundle.Parse(e.opt.TrustDomain, []byte(cm.Data[BundleFile]))
	if err != nil {
		b = x509bundle.New(e.opt.TrustDomain)
	}
	if b.HasX509Authority(root) {
		e.say("ConfigMap %s: kept", Bundle)
		return b, nil
	}
	b.AddX509Authority(root)
	pemData, err := b.Marshal()
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s: %w", Bundle, err)
	}
	cm.Data = map[string]string{BundleFile: string(pemData)}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("ConfigMap %s: %w", Bundle, err)
	}
	e.say("ConfigMap %s: the CA's root added", Bundle)
	return b, nil
}

// gateway ensures GatewaySVID holds a certificate for GatewayID that bundle verifies and that
// has a third of GatewayTTL or more left, minting a new one from ca otherwise.
func (e *ensurer) gateway(ctx context.Context, ca *svidca.CA, bundle *x509bundle.Bundle) error {
	secrets := e.client.CoreV1().Secrets(e.opt.Namespace)
	s, err := secrets.Get(ctx, GatewaySVID, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		s = nil
	case err != nil:
		return fmt.Errorf("Secret %s: %w", GatewaySVID, err)
	}
	why := ""
	if s != nil {
		if why = e.renewal(s, bundle); why == "" {
			e.say("Secret %s: kept", GatewaySVID)
			return nil
		}
	}
	svid, err := ca.Mint(e.opt.GatewayID, e.opt.GatewayTTL)
	if err != nil {
		return fmt.Errorf("Secret %s: %w", GatewaySVID, err)
	}
	cert, key, err := svid.Marshal()
	if err != nil {
		return fmt.Errorf("Secret %s: %w", GatewaySVID, err)
	}
	data := map[string][]byte{GatewayCert: cert, GatewayKey: key}
	if s == nil {
		_, err = secrets.Create(ctx, &corev1.Secret{ObjectMeta: e.meta(GatewaySVID), Type: corev1.SecretTypeOpaque, Data: data}, metav1.CreateOptions{})
		if err == nil {
			e.say("Secret %s: created", GatewaySVID)
		}
	} else {
		s.Data = data
		if _, err = secrets.Update(ctx, s, metav1.UpdateOptions{}); err == nil {
			e.say("Secret %s: renewed (%s)", GatewaySVID, why)
		}
	}
	if err != nil {
		return fmt.Errorf("Secret %s: %w", GatewaySVID, err)
	}
	return nil
}

// renewal says why the gateway's Secret s needs a new certificate, or "" when it does not.
func (e *ensurer) renewal(s *corev1.Secret, bundle *x509bundle.Bundle) string {
	svid, err := x509svid.Parse(s.Data[GatewayCert], s.Data[GatewayKey])
	if err != nil {
		return "unreadable"
	}
	if svid.ID != e.opt.GatewayID {
		return "another SPIFFE ID"
	}
	if _, _, err := x509svid.Verify(svid.Certificates, bundle); err != nil {
		return "not verified by the bundle"
	}
	leaf := svid.Certificates[0]
	if left := leaf.NotAfter.Sub(e.opt.Now()); left < leaf.NotAfter.Sub(leaf.NotBefore)/3 {
		return "less than a third of its life left"
	}
	return ""
}
