// Package natsconn opens the NATS connection every function uses to reach
// JetStream, from one shared piece of configuration.
package natsconn

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ConnSettings is embedded in each function's configuration.
type ConnSettings struct {
	URL     string `envconfig:"GDR_NATS_URL" default:"nats://127.0.0.1:4222" desc:"NATS server URL(s), comma-separated"`
	Creds   string `envconfig:"GDR_NATS_CREDS" desc:"path of a NATS credentials file; empty for none"`
	NKey    string `envconfig:"GDR_NATS_NKEY" desc:"path of an nkey seed file (NATS users with nkeys); empty for none"`
	TLSCA   string `envconfig:"GDR_NATS_TLS_CA" desc:"PEM file of the CA that signs the NATS server's certificate; empty: the system roots (tls:// URLs)"`
	TLSCert string `envconfig:"GDR_NATS_TLS_CERT" desc:"PEM file of the client certificate for NATS mutual TLS (with GDR_NATS_TLS_KEY)"`
	TLSKey  string `envconfig:"GDR_NATS_TLS_KEY" desc:"PEM file of the client key for NATS mutual TLS (with GDR_NATS_TLS_CERT)"`
}

// options are the authentication and TLS options of c.
func (c ConnSettings) options() ([]nats.Option, error) {
	var opts []nats.Option
	if c.Creds != "" && c.NKey != "" {
		return nil, errors.New("GDR_NATS_CREDS and GDR_NATS_NKEY: set one, not both")
	}
	if c.Creds != "" {
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	if c.NKey != "" {
		opt, err := nats.NkeyOptionFromSeed(c.NKey)
		if err != nil {
			// nats.go names the file and the cause, never the seed.
			return nil, fmt.Errorf("GDR_NATS_NKEY: %w", err)
		}
		opts = append(opts, opt)
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return nil, errors.New("GDR_NATS_TLS_CERT and GDR_NATS_TLS_KEY go together")
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	return opts, nil
}

// Check reports what in c cannot work, naming the variable.
func (c ConnSettings) Check() error {
	_, err := c.options()
	return err
}

// InboxPrefix is the prefix of the reply subjects of a connection named
// name: "_INBOX_<name>". With one prefix per function, each NATS user may
// subscribe to its own replies only (deploy/nats/authorization.conf), so no
// function can read another's answers (a payload the gateway reads, say).
func InboxPrefix(name string) string { return "_INBOX_" + name }

// Connect opens a connection named name (it shows in the server's
// monitoring, and names its reply subjects: InboxPrefix) and a JetStream
// context on it. The caller closes the
// connection with Close before it exits, so that acknowledgements in flight
// are sent.
func Connect(ctx context.Context, cfg ConnSettings, name string) (*nats.Conn, jetstream.JetStream, error) {
	auth, err := cfg.options()
	if err != nil {
		return nil, nil, err
	}
	opts := append([]nats.Option{nats.Name(name), nats.CustomInboxPrefix(InboxPrefix(name)),
		nats.Timeout(5 * time.Second), nats.MaxReconnects(-1)}, auth...)
	if deadline, ok := ctx.Deadline(); ok {
		opts = append(opts, nats.Timeout(time.Until(deadline)))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", Redact(cfg.URL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("JetStream on %s: %w", Redact(cfg.URL), err)
	}
	return nc, js, nil
}

// Redact returns urls (comma-separated) without their user information, which
// may hold a token or a password, for logs and errors.
func Redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			parts[i] = "<unparsable URL>"
			continue
		}
		u.User = nil
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// Close flushes what the connection still has to send (acknowledgements,
// naks, terminations) and closes it. Drain would return at once and finish in
// the background, which a process about to exit cannot wait for.
func Close(nc *nats.Conn) error {
	err := nc.FlushTimeout(5 * time.Second)
	nc.Close()
	return err
}

// Conn is what Connected reads of a connection (a *nats.Conn).
type Conn interface {
	Status() nats.Status
}

// Connected is the readiness check of conn: nil while it is connected;
// an error naming its state while it reconnects, drains or is closed.
func Connected(conn Conn) func(context.Context) error {
	return func(context.Context) error {
		if s := conn.Status(); s != nats.CONNECTED {
			return fmt.Errorf("NATS connection %s", strings.ToLower(s.String()))
		}
		return nil
	}
}
