// Package registryenv runs a real OCI distribution registry
// (go-containerregistry's pkg/registry, in memory) on 127.0.0.1 for
// end-to-end tests, behind HTTP basic authentication: every request without
// the registry's one user and password is answered 401 with a Basic
// challenge, as a private registry does. It records each manifest request
// and whether it was authenticated, so a test can assert that a node asked
// the registry (and was refused) or did not ask at all.
//
// Plain HTTP: a client must be told the registry is not TLS (containerd:
// a hosts.toml whose server is http://). StartAnonymousTLS serves HTTPS
// instead, with a certificate of a CA of its own (CAFile): a client trusts
// it as a user's machine trusts a private registry's CA (SSL_CERT_FILE for
// Go's clients, containerd: a hosts.toml naming the CA).
package registryenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// User is the registry's one user.
const User = "gdr-e2e"

// Registry is a running registry.
type Registry struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	// Password is User's, random per registry.
	Password string

	// CAFile is the PEM file of the CA that signed the registry's certificate
	// (StartAnonymousTLS; empty for plain HTTP).
	CAFile string

	anonymous bool
	mu        sync.Mutex
	requests  []ManifestRequest
}

// ManifestRequest is one request for a manifest (a pull resolves one first).
type ManifestRequest struct {
	Path          string
	Authenticated bool
}

// Start starts a registry, stopped when the test ends.
func Start(t testing.TB) *Registry {
	t.Helper()
	return start(t, false, false, nil)
}

// StartAnonymous starts a registry that lets anyone push and pull without credentials (Password
// is empty), as a registry the nodes pull from without them does (deploy/README.md's install
// pushes there with crane). Manifest requests are recorded as Start's are.
func StartAnonymous(t testing.TB) *Registry {
	t.Helper()
	return start(t, true, false, nil)
}

// StartAnonymousTLS is StartAnonymous serving HTTPS, its certificate valid for 127.0.0.1 and
// each of ips (the addresses it is forwarded to), signed by a new CA whose certificate is
// CAFile.
func StartAnonymousTLS(t testing.TB, ips ...net.IP) *Registry {
	t.Helper()
	return start(t, true, true, ips)
}

func start(t testing.TB, anonymous, serveTLS bool, tlsIPs []net.IP) *Registry {
	t.Helper()
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	r := &Registry{Password: hex.EncodeToString(b), anonymous: anonymous}
	if anonymous {
		r.Password = ""
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.Addr = ln.Addr().String()
	if serveTLS {
		cert, caFile := serverCertificate(t, append([]net.IP{net.IPv4(127, 0, 0, 1)}, tlsIPs...))
		r.CAFile = caFile
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}
	srv := &http.Server{Handler: r.auth(registry.New(registry.Logger(log.New(io.Discard, "", 0)))), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

func (r *Registry) auth(next http.Handler) http.Handler {
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(User+":"+r.Password))
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ok := r.anonymous || subtle.ConstantTimeCompare([]byte(req.Header.Get("Authorization")), []byte(want)) == 1
		if strings.Contains(req.URL.Path, "/manifests/") {
			r.mu.Lock()
			r.requests = append(r.requests, ManifestRequest{Path: req.URL.Path, Authenticated: ok})
			r.mu.Unlock()
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="registryenv"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, req)
	})
}

// ManifestRequests returns the manifest requests so far, in order.
func (r *Registry) ManifestRequests() []ManifestRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ManifestRequest(nil), r.requests...)
}

// Push pushes the image index of the OCI layout in dir (internal/imagebuild's
// output) to the registry as ref, a reference on r.Addr
// (<r.Addr>/<repository>:<tag>), with the registry's credentials.
func (r *Registry) Push(t testing.TB, dir, ref string) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	// The layout's index points at the image's own index (imagebuild).
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) == 1 && m.Manifests[0].MediaType.IsIndex() {
		if idx, err = idx.ImageIndex(m.Manifests[0].Digest); err != nil {
			t.Fatal(err)
		}
	}
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	auth := &authn.Basic{Username: User, Password: r.Password}
	if err := remote.WriteIndex(tag, idx, remote.WithAuth(auth)); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// DockerConfigJSON is the .dockerconfigjson of a kubernetes.io/dockerconfigjson
// Secret that lets a node pull from the registry at host (its address as
// the node reaches it).
func (r *Registry) DockerConfigJSON(host string) []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(User + ":" + r.Password))
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{"auth": auth}}})
	return b
}

// serverCertificate makes a CA (its certificate written to a file, returned) and a server
// certificate it signs for ips.
func serverCertificate(t testing.TB, ips []net.IP) (tls.Certificate, string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "registryenv CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2),
		Subject: pkix.Name{CommonName: "registryenv"}, IPAddresses: ips,
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
		ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "registry-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, caFile
}
