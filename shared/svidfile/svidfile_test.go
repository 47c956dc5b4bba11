package svidfile

import (
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

// write puts an SVID the CA mints for the gateway, and the bundle of cas, into dir.
func write(t *testing.T, dir string, ca *svidca.CA, cas ...*svidca.CA) *x509svid.SVID {
	t.Helper()
	svid, err := ca.Mint(spiffeid.RequireFromPath(td, "/gateway"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := svid.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var bundle []byte
	for _, c := range cas {
		for _, a := range c.Bundle().X509Authorities() {
			bundle = append(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Raw})...)
		}
	}
	for name, data := range map[string][]byte{"tls.crt": cert, "tls.key": key, "bundle.pem": bundle} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return svid
}

// The Source answers the files' SVID and bundle; after a renewal under a rotated CA it answers
// the new ones once Interval passed (not before); a file caught broken keeps the last good
// answer and is reported; a certificate the bundle does not verify is refused at Open.
func TestSourceFollowsTheFiles(t *testing.T) {
	dir := t.TempDir()
	oldCA, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	first := write(t, dir, oldCA, oldCA)
	var reported []error
	clock := time.Now()
	f := func(n string) string { return filepath.Join(dir, n) }
	s, err := Open(td, f("tls.crt"), f("tls.key"), f("bundle.pem"), Options{Interval: time.Minute, OnError: func(err error) { reported = append(reported, err) }})
	if err != nil {
		t.Fatal(err)
	}
	s.now, s.lastCheck = func() time.Time { return clock }, clock
	svidOf := func() *x509svid.SVID {
		t.Helper()
		got, err := s.GetX509SVID()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if !svidOf().Certificates[0].Equal(first.Certificates[0]) {
		t.Fatal("not the files' SVID")
	}
	second := write(t, dir, newCA, oldCA, newCA)
	if !svidOf().Certificates[0].Equal(first.Certificates[0]) {
		t.Fatal("read again before the interval passed")
	}
	clock = clock.Add(time.Minute)
	if !svidOf().Certificates[0].Equal(second.Certificates[0]) {
		t.Fatal("the renewed SVID was not read after the interval")
	}
	b, err := s.GetX509BundleForTrustDomain(td)
	if err != nil || len(b.X509Authorities()) != 2 {
		t.Fatalf("the rotated bundle: %v, %v", b, err)
	}
	if err := os.WriteFile(f("tls.crt"), []byte("not PEM, a volume mid-update"), 0o600); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Minute)
	if !svidOf().Certificates[0].Equal(second.Certificates[0]) || len(reported) != 1 {
		t.Fatalf("a broken file: the SVID changed or was not reported (%v)", reported)
	}
	write(t, dir, newCA, oldCA) // a certificate of the new CA, a bundle of the old alone
	if _, err := Open(td, f("tls.crt"), f("tls.key"), f("bundle.pem"), Options{}); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("Open of a certificate its bundle does not verify = %v", err)
	}
	if _, err := s.GetX509BundleForTrustDomain(spiffeid.RequireTrustDomainFromString("other.org")); err == nil {
		t.Fatal("a bundle for another trust domain")
	}
}
