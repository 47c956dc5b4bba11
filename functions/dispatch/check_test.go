package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

// `dispatch check` (helm test's): one line per question, exit 0 only when Gitea accepts every
// pool's registration and NATS has the assignments' stream; a password in a URL and the
// runner's token never printed.
func TestCheck(t *testing.T) {
	d := &declareOnly{}
	mux := http.NewServeMux()
	path, h := runnerv1connect.NewRunnerServiceHandler(d)
	mux.Handle("/api/actions"+path, http.StripPrefix("/api/actions", h))
	up := httptest.NewServer(mux)
	t.Cleanup(up.Close)
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "bad gateway", http.StatusBadGateway)
	}))
	t.Cleanup(down.Close)

	dir := t.TempDir()
	poolsFile := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(poolsFile, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := (gitea.FileStore{Path: filepath.Join(dir, "linux.json")}).Save(gitea.Credentials{ID: 1, UUID: "u", Token: "runner-token-secret"}); err != nil {
		t.Fatal(err)
	}
	_, bare := jetstreamenv.Start(t)       // no stream
	withStream := jetstreamenv.NewQueue(t) // the assignments' stream, as handle's setup makes it
	withPassword := func(u string) string { return strings.Replace(u, "nats://", "nats://dispatch:nats-password@", 1) }
	spire := spireStandIn(t, "spiffe://example.org/spire/server")
	for _, tc := range []struct {
		name, gitea, nats string
		wantCode          int
		want              []string
		spire, td         string
	}{
		{"ready", up.URL + "/", withPassword(withStream.URL), 0, []string{
			"gitea " + up.URL + "/: pool linux: ok",
			"nats " + strings.Replace(withStream.URL, "nats://", "nats://dispatch:xxxxx@", 1) + ": user dispatch: ok",
			": stream CI_RUNNER: ok",
		}, "", ""},
		{"no stream", up.URL + "/", bare, 1, []string{"user dispatch: ok", ": stream CI_RUNNER: nats: API error: code=404"}, "", ""},
		{"gitea fails", down.URL + "/", withStream.URL, 1, []string{"gitea " + down.URL + "/: pool linux: gitea Declare: unavailable", ": stream CI_RUNNER: ok"}, "", ""},
		{"spire", up.URL + "/", withStream.URL, 0, []string{"spire " + spire + ": server spiffe://example.org/spire/server: ok"}, spire, "example.org"},
		{"spire of another trust domain", up.URL + "/", withStream.URL, 1, []string{"spire " + spire + ": its SVID spiffe://example.org/spire/server is not of trust domain ci.example.net"}, spire, "ci.example.net"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range map[string]string{
				"GDR_GITEA_URL": tc.gitea, "GDR_POOLS_FILE": poolsFile, "GDR_STATE_DIR": dir, "GDR_NATS_URL": tc.nats,
				"GDR_SPIRE_SERVER": tc.spire, "GDR_TRUST_DOMAIN": tc.td,
			} {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := executeTo(context.Background(), []string{"check"}, &stdout, &stderr)
			out := stdout.String()
			t.Logf("%s", out)
			if code != tc.wantCode {
				t.Fatalf("dispatch check exited %d, want %d:\n%s%s", code, tc.wantCode, out, stderr.String())
			}
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("the report lacks %q:\n%s", want, out)
				}
			}
			for _, secret := range []string{"nats-password", "runner-token-secret"} {
				if strings.Contains(out+stderr.String(), secret) {
					t.Errorf("the output shows %q:\n%s%s", secret, out, stderr.String())
				}
			}
		})
	}
}

// spireStandIn serves TLS on 127.0.0.1 with an X.509-SVID of id, as the SPIRE Server's TCP API
// presents its own (check reads no more of it), and returns its address.
func spireStandIn(t *testing.T, id string) string {
	t.Helper()
	sid := spiffeid.RequireFromString(id)
	ca, err := svidca.New(sid.TrustDomain())
	if err != nil {
		t.Fatal(err)
	}
	svid, err := ca.Mint(sid, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{PrivateKey: svid.PrivateKey}
	for _, c := range svid.Certificates {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.(*tls.Conn).Handshake()
				_ = c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}
