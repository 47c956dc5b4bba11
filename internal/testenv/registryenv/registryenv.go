// Package registryenv runs a real OCI distribution registry
// (go-containerregistry's pkg/registry, in memory) on 127.0.0.1 for
// end-to-end tests, behind HTTP basic authentication: every request without
// the registry's one user and password is answered 401 with a Basic
// challenge, as a private registry does. It records each manifest request
// and whether it was authenticated, so a test can assert that a node asked
// the registry (and was refused) or did not ask at all.
//
// Plain HTTP: a client must be told the registry is not TLS (containerd:
// a hosts.toml whose server is http://).
package registryenv

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
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
	return start(t, false)
}

// StartAnonymous starts a registry that lets anyone push and pull without credentials (Password
// is empty), as a registry the nodes pull from without them does (deploy/README.md's install
// pushes there with crane). Manifest requests are recorded as Start's are.
func StartAnonymous(t testing.TB) *Registry {
	t.Helper()
	return start(t, true)
}

func start(t testing.TB, anonymous bool) *Registry {
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
