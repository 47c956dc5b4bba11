package registryenv

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// TestPrivateRegistry: a pushed image is served with the credentials and refused without, and
// both manifest requests are recorded as such.
func TestPrivateRegistry(t *testing.T) {
	r := Start(t)
	idx, err := random.Index(64, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := layout.Write(dir, empty.Index); err != nil {
		t.Fatal(err)
	}
	p, _ := layout.FromPath(dir)
	if err := p.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
	ref := r.Addr + "/tenant-a/private:1"
	r.Push(t, dir, ref)
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Index(tag, remote.WithAuth(&authn.Basic{Username: User, Password: r.Password})); err != nil {
		t.Fatalf("pull with the credentials: %v", err)
	}
	_, err = remote.Index(tag)
	var terr *transport.Error
	if !errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("pull without credentials: %v, want 401", err)
	}
	var with, without int
	for _, m := range r.ManifestRequests() {
		if m.Authenticated {
			with++
		} else {
			without++
		}
	}
	if with == 0 || without == 0 {
		t.Fatalf("manifest requests %+v: want authenticated and refused ones", r.ManifestRequests())
	}
}

// TestTLSRegistry: the TLS registry serves a client that trusts its CA and fails the handshake
// of one that does not.
func TestTLSRegistry(t *testing.T) {
	r := StartAnonymousTLS(t)
	ca, err := os.ReadFile(r.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("no CA certificate in CAFile")
	}
	trusting := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(r.Addr + "/tls/image:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithTransport(trusting)); err != nil {
		t.Fatalf("push trusting the CA: %v", err)
	}
	resp, err := (&http.Client{Transport: trusting}).Get("https://" + r.Addr + "/v2/")
	if err != nil {
		t.Fatalf("https with the CA: %v", err)
	}
	resp.Body.Close()
	var unknown x509.UnknownAuthorityError
	if _, err := http.Get("https://" + r.Addr + "/v2/"); !errors.As(err, &unknown) {
		t.Fatalf("https without the CA: %v, want an unknown authority", err)
	}
}
