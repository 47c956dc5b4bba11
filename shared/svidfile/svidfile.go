// Package svidfile is an X.509-SVID and its trust bundle kept in PEM files (a Kubernetes
// Secret or ConfigMap volume), read again when they change: a function that has no SPIFFE
// Workload API (the installation's own CA, GDR_POD_IDENTITY=ca) keeps serving across a
// renewal of its certificate and a rotation of the bundle, as the Workload API's source would.
//
// The invariant a caller relies on: GetX509SVID and GetX509BundleForTrustDomain answer what
// the files held at the last look, at most Interval old; a look that finds the files changed
// but unreadable (a volume caught mid-update, a bad PEM) keeps the last good answer and reports
// the error to OnError, so that a TLS server never loses its certificate to a bad write.
package svidfile

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// DefaultInterval is how often the files are looked at, at most: a kubelet updates a mounted
// Secret a minute or so after it changed.
const DefaultInterval = 10 * time.Second

// Source is the SVID of CertFile and KeyFile and the bundle of BundleFile, for trust domain
// TrustDomain. Safe for concurrent use.
type Source struct {
	td                            spiffeid.TrustDomain
	certFile, keyFile, bundleFile string
	interval                      time.Duration
	onError                       func(error)
	now                           func() time.Time

	mu        sync.Mutex
	svid      *x509svid.SVID
	bundle    *x509bundle.Bundle
	stamp     string
	lastCheck time.Time
}

// Options tune a Source; the zero value is DefaultInterval and no error report.
type Options struct {
	Interval time.Duration
	// OnError hears a look that found the files changed and could not read them.
	OnError func(error)
}

// Open reads the files once (an error names the file at fault) and returns their Source.
func Open(td spiffeid.TrustDomain, certFile, keyFile, bundleFile string, opt Options) (*Source, error) {
	s := &Source{td: td, certFile: certFile, keyFile: keyFile, bundleFile: bundleFile,
		interval: opt.Interval, onError: opt.OnError, now: time.Now}
	if s.interval <= 0 {
		s.interval = DefaultInterval
	}
	stamp, err := s.stampNow()
	if err != nil {
		return nil, err
	}
	if err := s.load(stamp); err != nil {
		return nil, err
	}
	s.lastCheck = s.now()
	return s, nil
}

// stampNow says when and how big each file is: a change of either is a change of the file.
func (s *Source) stampNow() (string, error) {
	var stamp string
	for _, f := range []string{s.certFile, s.keyFile, s.bundleFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("svidfile: %w", err)
		}
		stamp += fmt.Sprintf("%s:%d:%d;", f, fi.ModTime().UnixNano(), fi.Size())
	}
	return stamp, nil
}

func (s *Source) load(stamp string) error {
	svid, err := x509svid.Load(s.certFile, s.keyFile)
	if err != nil {
		return fmt.Errorf("svidfile: %s, %s: %w", s.certFile, s.keyFile, err)
	}
	if !svid.ID.MemberOf(s.td) {
		return fmt.Errorf("svidfile: %s holds %s, not of trust domain %s", s.certFile, svid.ID, s.td.Name())
	}
	bundle, err := x509bundle.Load(s.td, s.bundleFile)
	if err != nil {
		return fmt.Errorf("svidfile: %s: %w", s.bundleFile, err)
	}
	if _, _, err := x509svid.Verify(svid.Certificates, bundle); err != nil {
		return fmt.Errorf("svidfile: %s does not verify with %s: %w", s.certFile, s.bundleFile, err)
	}
	s.svid, s.bundle, s.stamp = svid, bundle, stamp
	return nil
}

// refresh reads the files again when Interval has passed since the last look and they
// changed.
func (s *Source) refresh() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if now.Sub(s.lastCheck) < s.interval {
		return
	}
	s.lastCheck = now
	stamp, err := s.stampNow()
	if err == nil && stamp == s.stamp {
		return
	}
	if err == nil {
		err = s.load(stamp)
	}
	if err != nil && s.onError != nil {
		s.onError(err)
	}
}

// GetX509SVID implements x509svid.Source.
func (s *Source) GetX509SVID() (*x509svid.SVID, error) {
	s.refresh()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.svid, nil
}

// GetX509BundleForTrustDomain implements x509bundle.Source.
func (s *Source) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if td != s.td {
		return nil, errors.New("svidfile: no bundle for trust domain " + td.Name())
	}
	s.refresh()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bundle, nil
}
