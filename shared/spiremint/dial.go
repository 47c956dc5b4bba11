package spiremint

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Remote is a Minter for a SPIRE Server named by an address, connected on
// its first MintX509SVID (so a function that never mints, like recover,
// never needs the server, nor an SVID of its own). It implements
// bootstrap.Minter and is safe for concurrent use; Close releases the
// connection.
//
// The address is either
//   - unix:<path>: the server's admin socket; the caller is local, hence
//     admin, and the socket must be mounted into the function's Pod;
//   - <host>:<port>: the server's TCP API, with mutual TLS: the function
//     presents its own X.509-SVID from the SPIFFE Workload API
//     (SPIFFE_ENDPOINT_SOCKET), which must be one of the server's
//     admin_ids, and accepts only spiffe://<trust domain>/spire/server.
type Remote struct {
	target string
	td     spiffeid.TrustDomain

	mu     sync.Mutex
	minter *Minter
	conn   *grpc.ClientConn
	source *workloadapi.X509Source
	closed bool
}

// Dial checks addr and returns a Remote for it, serving trust domain td.
// It connects nothing yet.
func Dial(addr string, td spiffeid.TrustDomain) (*Remote, error) {
	if td.IsZero() {
		return nil, errors.New("spiremint: no trust domain")
	}
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		if path == "" {
			return nil, fmt.Errorf("spiremint: SPIRE Server address %q has no socket path", addr)
		}
		return &Remote{target: "unix://" + strings.TrimPrefix(path, "//"), td: td}, nil
	}
	if strings.Contains(addr, "/") || !strings.Contains(addr, ":") {
		return nil, fmt.Errorf("spiremint: SPIRE Server address %q is neither host:port nor unix:<path>", addr)
	}
	return &Remote{target: addr, td: td}, nil
}

// MintX509SVID connects if it has not yet, then mints (see
// Minter.MintX509SVID). A failure to connect is an error like the
// server's: transient, naming what to fix.
func (r *Remote) MintX509SVID(ctx context.Context, id spiffeid.ID, ttl time.Duration) (*x509svid.SVID, *x509bundle.Bundle, error) {
	m, err := r.connect(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("spiremint: mint %s: %w", id, err)
	}
	return m.MintX509SVID(ctx, id, ttl)
}

// connect makes the connection once. It holds r's lock while it waits for
// the Workload API (at most until ctx ends), so concurrent first mints wait
// for one connection rather than racing to make several; a failed connect
// leaves nothing behind and the next mint tries again.
func (r *Remote) connect(ctx context.Context) (*Minter, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errors.New("the SPIRE Server connection is closed")
	}
	if r.minter != nil {
		return r.minter, nil
	}
	creds := insecure.NewCredentials()
	var source *workloadapi.X509Source
	if !strings.HasPrefix(r.target, "unix://") {
		var err error
		// Blocks until the Workload API hands out this function's SVID,
		// or ctx ends; the source then keeps it rotated.
		source, err = workloadapi.NewX509Source(ctx)
		if err != nil {
			return nil, fmt.Errorf("this function's own SVID from the SPIFFE Workload API (SPIFFE_ENDPOINT_SOCKET), to authenticate to the SPIRE Server at %s: %w", r.target, err)
		}
		server := spiffeid.RequireFromPath(r.td, "/spire/server")
		creds = credentials.NewTLS(tlsconfig.MTLSClientConfig(source, source, tlsconfig.AuthorizeID(server)))
	}
	conn, err := grpc.NewClient(r.target, grpc.WithTransportCredentials(creds))
	if err != nil {
		if source != nil {
			_ = source.Close()
		}
		return nil, fmt.Errorf("the SPIRE Server at %s: %w", r.target, err)
	}
	r.conn, r.source, r.minter = conn, source, New(conn)
	return r.minter, nil
}

// Close releases the connection and the Workload API source, if any. A
// MintX509SVID after Close fails.
func (r *Remote) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	var errs []error
	if r.conn != nil {
		errs = append(errs, r.conn.Close())
	}
	if r.source != nil {
		errs = append(errs, r.source.Close())
	}
	r.conn, r.source, r.minter = nil, nil, nil
	return errors.Join(errs...)
}

// ClientConn returns a gRPC connection to the SPIRE Server API at addr, in
// the forms Dial takes, for callers of APIs other than minting (the pod
// backend's registration entries). gRPC connects on first use; over TCP the
// first handshake fetches this function's own X.509-SVID from the Workload
// API (SPIFFE_ENDPOINT_SOCKET, waiting at most workloadAPIWait) and the
// server must present spiffe://<td>/spire/server. What the caller may do is
// the server's authorization policy's to say (deploy/spire/policy.rego). The
// returned function closes the connection and the Workload API source.
func ClientConn(addr string, td spiffeid.TrustDomain) (*grpc.ClientConn, func() error, error) {
	r, err := Dial(addr, td)
	if err != nil {
		return nil, nil, err
	}
	creds := insecure.NewCredentials()
	src := &lazySource{wait: workloadAPIWait}
	if !strings.HasPrefix(r.target, "unix://") {
		server := spiffeid.RequireFromPath(td, "/spire/server")
		creds = credentials.NewTLS(tlsconfig.MTLSClientConfig(src, src, tlsconfig.AuthorizeID(server)))
	}
	conn, err := grpc.NewClient(r.target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, nil, fmt.Errorf("spiremint: the SPIRE Server at %s: %w", addr, err)
	}
	return conn, func() error { return errors.Join(conn.Close(), src.Close()) }, nil
}

// workloadAPIWait bounds the wait for this function's own SVID on a
// handshake: the agent hands it out at once when the function's entry exists.
const workloadAPIWait = 30 * time.Second

// lazySource is an X.509 SVID and bundle source that opens the Workload API
// on first use (a TLS handshake), so that building a client never blocks;
// a failed open is retried on the next handshake.
type lazySource struct {
	wait time.Duration

	mu  sync.Mutex
	src *workloadapi.X509Source
}

func (l *lazySource) get() (*workloadapi.X509Source, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.src != nil {
		return l.src, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.wait)
	defer cancel()
	src, err := workloadapi.NewX509Source(ctx)
	if err != nil {
		return nil, fmt.Errorf("this function's own SVID from the SPIFFE Workload API (SPIFFE_ENDPOINT_SOCKET), to authenticate to the SPIRE Server: %w", err)
	}
	l.src = src
	return src, nil
}

// GetX509SVID implements x509svid.Source.
func (l *lazySource) GetX509SVID() (*x509svid.SVID, error) {
	src, err := l.get()
	if err != nil {
		return nil, err
	}
	return src.GetX509SVID()
}

// GetX509BundleForTrustDomain implements x509bundle.Source.
func (l *lazySource) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	src, err := l.get()
	if err != nil {
		return nil, err
	}
	return src.GetX509BundleForTrustDomain(td)
}

// Close closes the Workload API source, if it was opened.
func (l *lazySource) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.src == nil {
		return nil
	}
	err := l.src.Close()
	l.src = nil
	return err
}
