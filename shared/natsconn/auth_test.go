package natsconn

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// startWithNkeyUser starts a NATS server on 127.0.0.1 that admits only the
// nkey user pub, with perms (nil: everything).
func startWithNkeyUser(t *testing.T, pub string, perms *server.Permissions) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), Nkeys: []*server.NkeyUser{{Nkey: pub, Permissions: perms}}})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS did not start")
	}
	return s.ClientURL()
}

func seedFile(t *testing.T) (path, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ = kp.PublicKey()
	path = filepath.Join(t.TempDir(), "nkey")
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, pub
}

func TestConnectWithNkey(t *testing.T) {
	seed, pub := seedFile(t)
	stranger, _ := seedFile(t)
	url := startWithNkeyUser(t, pub, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	nc, _, err := Connect(ctx, ConnSettings{URL: url, NKey: seed}, "test")
	if err != nil {
		t.Fatalf("Connect with the user's seed: %v", err)
	}
	_ = Close(nc)
	for _, tc := range []struct {
		name string
		cfg  ConnSettings
		want string
	}{
		{"no credentials", ConnSettings{URL: url}, "Authorization Violation"},
		{"another user's seed", ConnSettings{URL: url, NKey: stranger}, "Authorization Violation"},
		{"missing seed file", ConnSettings{URL: url, NKey: filepath.Join(t.TempDir(), "none")}, "GDR_NATS_NKEY"},
		{"creds and nkey", ConnSettings{URL: url, NKey: seed, Creds: seed}, "set one, not both"},
		{"cert without key", ConnSettings{URL: url, TLSCert: seed}, "go together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, _, err := Connect(ctx, tc.cfg, "test")
			if err == nil {
				_ = Close(nc)
				t.Fatal("Connect succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Connect() error = %v, want it to mention %q", err, tc.want)
			}
			if data, _ := os.ReadFile(seed); strings.Contains(err.Error(), string(data)) {
				t.Fatalf("the error shows the seed: %v", err)
			}
		})
	}
}

// A user that may subscribe to its own reply subjects only still makes
// JetStream calls: Connect names its inbox after the connection.
func TestRepliesComeToTheConnectionsOwnInbox(t *testing.T) {
	seed, pub := seedFile(t)
	url := startWithNkeyUser(t, pub, &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{InboxPrefix("probe") + ".>"}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{{"probe", true}, {"other", false}} {
		nc, js, err := Connect(ctx, ConnSettings{URL: url, NKey: seed}, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		callCtx, callCancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = js.AccountInfo(callCtx)
		callCancel()
		_ = Close(nc)
		if (err == nil) != tc.ok {
			t.Errorf("JetStream call as connection %q: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
