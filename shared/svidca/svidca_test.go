package svidca

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

func TestMintedSVIDsAuthenticateBothWays(t *testing.T) {
	ca, err := New(td)
	if err != nil {
		t.Fatal(err)
	}
	serverID := spiffeid.RequireFromPath(td, "/gateway")
	clientID := spiffeid.RequireFromPath(td, "/repo/alice/repo/task/1")
	server, err := ca.Mint(serverID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Mint(clientID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsconfig.MTLSServerConfig(server, ca, tlsconfig.AuthorizeMemberOf(td)))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := x509svid.IDFromCert(r.TLS.PeerCertificates[0])
		if err != nil {
			t.Error(err)
		}
		_, _ = io.WriteString(w, id.String())
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "https://" + ln.Addr().String()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsconfig.MTLSClientConfig(client, ca, tlsconfig.AuthorizeID(serverID))}}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != clientID.String() {
		t.Fatalf("server saw %q", body)
	}
	// An SVID of another CA (same trust domain name) is refused.
	other, _ := New(td)
	stranger, _ := other.Mint(clientID, time.Hour)
	hc = &http.Client{Transport: &http.Transport{TLSClientConfig: tlsconfig.MTLSClientConfig(stranger, ca, tlsconfig.AuthorizeID(serverID))}}
	if _, err := hc.Get(url); err == nil {
		t.Fatal("a stranger's SVID was accepted")
	}
}

func TestMintRefuses(t *testing.T) {
	ca, _ := New(td)
	if _, err := ca.Mint(spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString("evil.example.org"), "/x"), time.Hour); err == nil {
		t.Fatal("minted outside the trust domain")
	}
	if _, err := ca.Mint(spiffeid.RequireFromPath(td, "/x"), 0); err == nil {
		t.Fatal("minted with TTL 0")
	}
	svid, err := ca.Mint(spiffeid.RequireFromPath(td, "/x"), time.Minute)
	if err != nil || time.Until(svid.Certificates[0].NotAfter) > time.Minute {
		t.Fatalf("TTL not applied: %v", err)
	}
}

func TestLoadOrCreate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	first, err := LoadOrCreate(dir, td)
	if err != nil {
		t.Fatal(err)
	}
	second, err := LoadOrCreate(dir, td)
	if err != nil {
		t.Fatal(err)
	}
	if !first.cert.Equal(second.cert) {
		t.Fatal("a reload made another CA")
	}
	svid, err := second.Mint(spiffeid.RequireFromPath(td, "/x"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, first); err != nil {
		t.Fatalf("an SVID of the reloaded CA does not verify against the first: %v", err)
	}
	info, err := os.Stat(filepath.Join(dir, "ca-key.pem"))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode = %v, %v", info.Mode(), err)
	}
	if _, err := LoadOrCreate(dir, spiffeid.RequireTrustDomainFromString("other.example.org")); err == nil || !strings.Contains(err.Error(), "not of trust domain") {
		t.Fatalf("a CA of another trust domain loaded: %v", err)
	}
}

// Load reads a CA's folder (a Secret volume) and creates nothing where there is none; with
// bundle.pem (a rotation: the old root and the new), its SVIDs carry both authorities, so an
// executor minted by the new root verifies a gateway whose certificate the old root signed; a
// bundle.pem without the CA's own certificate is refused.
func TestLoadWithRotationBundle(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir, td); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load of an empty folder = %v, want not exist", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("Load wrote %v", entries)
	}
	old, err := New(td)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(dir, td); err != nil { // the new root
		t.Fatal(err)
	}
	current, err := Load(dir, td)
	if err != nil {
		t.Fatal(err)
	}
	bundle := func(cas ...*CA) {
		t.Helper()
		var b []byte
		for _, c := range cas {
			b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw})...)
		}
		if err := os.WriteFile(filepath.Join(dir, BundleFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bundle(old)
	if _, err := Load(dir, td); err == nil || !strings.Contains(err.Error(), "does not hold the CA's own certificate") {
		t.Fatalf("Load with a bundle lacking the CA = %v", err)
	}
	bundle(old, current)
	executorID := spiffeid.RequireFromPath(td, "/repo/alice/repo/task/1")
	svid, b, err := NewDeferred(dir, td).MintX509SVID(context.Background(), executorID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b.X509Authorities()); n != 2 {
		t.Fatalf("the bundle of a minted SVID holds %d authorities, want the old and the new root", n)
	}
	gateway, err := old.Mint(spiffeid.RequireFromPath(td, "/gateway"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := x509svid.Verify(gateway.Certificates, b); err != nil {
		t.Errorf("the old root's gateway certificate does not verify with the minted bundle: %v", err)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, b); err != nil {
		t.Errorf("the new root's SVID does not verify: %v", err)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, old.Bundle()); err == nil {
		t.Error("the old root alone verifies an SVID the new one signed")
	}
}

// A Deferred CA reads nothing until its first mint, and loads again after a failed load.
func TestDeferredLoadsOnMint(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	ca := NewDeferred(dir, td)
	id := spiffeid.RequireFromPath(td, "/repo/alice/repo/task/1")
	if _, _, err := ca.MintX509SVID(context.Background(), id, time.Hour); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a mint before the CA exists = %v, want not exist", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the deferred CA created its folder: %v", err)
	}
	if _, err := LoadOrCreate(dir, td); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.MintX509SVID(context.Background(), id, time.Hour); err != nil {
		t.Fatalf("a mint once the CA exists: %v", err)
	}
}
