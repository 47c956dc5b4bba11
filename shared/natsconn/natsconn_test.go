package natsconn

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
)

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"nats://s3cret-token@127.0.0.1:4222":     "nats://127.0.0.1:4222",
		"nats://user:pa55@a:4222, nats://b:4222": "nats://a:4222,nats://b:4222",
		"nats://127.0.0.1:4222":                  "nats://127.0.0.1:4222",
		"nats://user:pa55@[::1]:4222":            "nats://[::1]:4222",
		"nats://user:pa55@host:4222/%zz":         "<unparsable URL>",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestConnect(t *testing.T) {
	_, url := jetstreamenv.Start(t)
	nc, js, err := Connect(context.Background(), ConnSettings{URL: url}, "natsconn-test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := js.AccountInfo(context.Background()); err != nil {
		t.Fatalf("JetStream not usable: %v", err)
	}
}

func TestConnectErrorHidesCredentials(t *testing.T) {
	_, _, err := Connect(context.Background(), ConnSettings{URL: "nats://s3cret@127.0.0.1:1"}, "natsconn-test")
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("err = %v", err)
	}
}

// Connected follows the connection: ready while connected, not while the
// server is gone (reconnecting), nor once the connection is closed.
func TestConnected(t *testing.T) {
	s, url := jetstreamenv.Start(t)
	nc, _ := jetstreamenv.Connect(t, url)
	ready := Connected(nc)
	if err := ready(t.Context()); err != nil {
		t.Fatalf("connected: %v", err)
	}
	s.Shutdown()
	deadline := time.Now().Add(5 * time.Second)
	for ready(t.Context()) == nil {
		if time.Now().After(deadline) {
			t.Fatal("still ready 5s after the server stopped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	nc.Close()
	if err := ready(t.Context()); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("closed connection: %v, want an error saying closed", err)
	}
}
