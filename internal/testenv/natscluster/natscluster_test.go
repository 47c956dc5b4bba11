package natscluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/natscluster"
)

// bin is nats-server, built once for the test binary by TestMain.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "natscluster-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if bin, err = natscluster.Build(ctx, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// connect opens a client to urls that fails over quickly, and a JetStream
// context on it; closed at cleanup.
func connect(t *testing.T, urls string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(urls, nats.Timeout(time.Second), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("connect to %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// createR3 creates a file stream of three replicas taking subject name.>.
func createR3(ctx context.Context, t *testing.T, js jetstream.JetStream, name string) jetstream.Stream {
	t.Helper()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"},
		Storage: jetstream.FileStorage, Replicas: 3})
	if err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	return s
}

// publish publishes n messages "<from+k>" to name.msg and checks each ack's
// sequence.
func publish(ctx context.Context, t *testing.T, js jetstream.JetStream, name string, from, n int) {
	t.Helper()
	for k := from; k < from+n; k++ {
		ack, err := js.Publish(ctx, name+".msg", fmt.Appendf(nil, "%d", k))
		if err != nil {
			t.Fatalf("publish message %d: %v", k, err)
		}
		if ack.Sequence != uint64(k) {
			t.Fatalf("message %d acked with sequence %d", k, ack.Sequence)
		}
	}
}

// readAll checks that the stream holds messages 1..n in order.
func readAll(ctx context.Context, t *testing.T, s jetstream.Stream, n int) {
	t.Helper()
	for k := 1; k <= n; k++ {
		m, err := s.GetMsg(ctx, uint64(k))
		if err != nil {
			t.Fatalf("get message %d: %v", k, err)
		}
		if got, want := string(m.Data), fmt.Sprint(k); got != want {
			t.Fatalf("message %d holds %q, want %q", k, got, want)
		}
	}
}

// clusterInfo returns the stream's cluster as its leader reports it.
func clusterInfo(ctx context.Context, t *testing.T, s jetstream.Stream) *jetstream.ClusterInfo {
	t.Helper()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.Cluster == nil {
		t.Fatal("stream info has no cluster")
	}
	return info.Cluster
}

// assertDead checks that server i's client port refuses connections.
func assertDead(t *testing.T, c *natscluster.Cluster, i int) {
	t.Helper()
	addr := strings.TrimPrefix(c.URL(i), "nats://")
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("%s (%s) still accepts connections", c.Name(i), addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s (%s): %v, want connection refused", c.Name(i), addr, err)
	}
}

// assertReplica checks that server i's own copy of stream holds messages 1..n.
func assertReplica(ctx context.Context, t *testing.T, c *natscluster.Cluster, i int, stream string, n uint64) {
	t.Helper()
	r, err := c.Replica(ctx, i, stream)
	if err != nil {
		t.Fatal(err)
	}
	if r.Messages != n || r.FirstSeq != 1 || r.LastSeq != n {
		t.Fatalf("%s's copy of %s: %+v, want messages 1..%d", c.Name(i), stream, r, n)
	}
}

func TestStartServesR3Stream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := natscluster.StartT(t, bin, 3)
	if got := strings.Count(c.URLs(), ","); got != 2 {
		t.Fatalf("URLs() = %q, want three", c.URLs())
	}
	meta, err := c.MetaLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	js := connect(t, c.URLs())
	s := createR3(ctx, t, js, "START")
	publish(ctx, t, js, "START", 1, 10)
	leader, err := c.WaitStreamCurrent(ctx, "START")
	if err != nil {
		t.Fatal(err)
	}
	ci := clusterInfo(ctx, t, s)
	if ci.Leader != c.Name(leader) {
		t.Fatalf("stream info names leader %q, the servers' /jsz %s", ci.Leader, c.Name(leader))
	}
	if ci.Name != "gdr" {
		t.Fatalf("cluster name %q, want gdr", ci.Name)
	}
	if len(ci.Replicas) != 2 {
		t.Fatalf("stream info lists %d followers, want 2 (3 replicas)", len(ci.Replicas))
	}
	for _, r := range ci.Replicas {
		if r.Name == ci.Leader || c.Index(r.Name) < 0 || !r.Current || r.Offline {
			t.Fatalf("follower %+v: want another server of the cluster, current and online", r)
		}
	}
	for i := range c.Len() {
		assertReplica(ctx, t, c, i, "START", 10)
	}
	t.Logf("meta leader %s, stream leader %s", c.Name(meta), c.Name(leader))
}

func TestKillStreamLeader(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	c := natscluster.StartT(t, bin, 3)
	js := connect(t, c.URLs())
	s := createR3(ctx, t, js, "KILL")
	publish(ctx, t, js, "KILL", 1, 50)
	old, err := c.WaitStreamCurrent(ctx, "KILL")
	if err != nil {
		t.Fatal(err)
	}

	killed := time.Now()
	if err := c.Kill(old); err != nil {
		t.Fatal(err)
	}
	assertDead(t, c, old)
	leader, err := c.WaitStreamLeader(ctx, "KILL")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stream leader %s killed, %s elected in %s", c.Name(old), c.Name(leader), time.Since(killed).Round(time.Millisecond))
	if leader == old {
		t.Fatalf("the killed %s is still the leader", c.Name(old))
	}
	if ci := clusterInfo(ctx, t, s); ci.Leader != c.Name(leader) {
		t.Fatalf("stream info names leader %q, want %s", ci.Leader, c.Name(leader))
	}
	readAll(ctx, t, s, 50)
	publish(ctx, t, js, "KILL", 51, 10)

	restarted := time.Now()
	if err := c.Restart(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStreamCurrent(ctx, "KILL"); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s restarted and current in %s", c.Name(old), time.Since(restarted).Round(time.Millisecond))
	found := false
	for _, r := range clusterInfo(ctx, t, s).Replicas {
		if r.Name == c.Name(old) {
			found = r.Current && !r.Offline
		}
	}
	if !found {
		t.Fatalf("stream info does not list the restarted %s as a current replica", c.Name(old))
	}
	assertReplica(ctx, t, c, old, "KILL", 60)
}

func TestMetaLeaderEnds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  func(c *natscluster.Cluster, i int) error
	}{
		{"SIGKILL", (*natscluster.Cluster).Kill},
		{"SIGTERM", func(c *natscluster.Cluster, i int) error { return c.Stop(i, 10*time.Second) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
			defer cancel()
			c := natscluster.StartT(t, bin, 3)
			old, err := c.MetaLeader(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ended := time.Now()
			if err := tc.end(c, old); err != nil {
				t.Fatal(err)
			}
			assertDead(t, c, old)
			leader, err := c.WaitMetaLeader(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("meta leader %s ended (%s), %s elected in %s", c.Name(old), tc.name, c.Name(leader), time.Since(ended).Round(time.Millisecond))
			if leader == old {
				t.Fatalf("the ended %s is still the meta leader", c.Name(old))
			}
			// Creating a stream takes the meta leader: two servers of three
			// are enough for one of two replicas.
			js := connect(t, c.URL(leader))
			createCtx, createCancel := context.WithTimeout(ctx, 10*time.Second)
			defer createCancel()
			if _, err := js.CreateStream(createCtx, jetstream.StreamConfig{Name: "AFTER", Subjects: []string{"after.>"}, Replicas: 2}); err != nil {
				t.Fatalf("create a stream under the new meta leader: %v", err)
			}
			restarted := time.Now()
			if err := c.Restart(ctx, old); err != nil {
				t.Fatal(err)
			}
			if err := c.WaitHealthy(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s restarted, cluster healthy in %s", c.Name(old), time.Since(restarted).Round(time.Millisecond))
		})
	}
}

func TestPausedFollower(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	c := natscluster.StartT(t, bin, 3)
	leader, err := func() (int, error) {
		js := connect(t, c.URLs())
		createR3(ctx, t, js, "PAUSE")
		return c.WaitStreamCurrent(ctx, "PAUSE")
	}()
	if err != nil {
		t.Fatal(err)
	}
	follower := (leader + 1) % c.Len()
	// A client of the leader alone: one of the paused server would hang.
	js := connect(t, c.URL(leader))
	s, err := js.Stream(ctx, "PAUSE")
	if err != nil {
		t.Fatal(err)
	}

	if err := c.Pause(ctx, follower); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(c.URL(follower), nats.Timeout(500*time.Millisecond), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatalf("the paused %s accepted a client", c.Name(follower))
	}
	pubCtx, pubCancel := context.WithTimeout(ctx, 5*time.Second)
	published := time.Now()
	publish(pubCtx, t, js, "PAUSE", 1, 20)
	pubCancel()
	t.Logf("20 acks with %s paused in %s", c.Name(follower), time.Since(published).Round(time.Millisecond))
	for _, r := range clusterInfo(ctx, t, s).Replicas {
		if r.Name == c.Name(follower) && r.Current {
			t.Fatalf("the leader counts the paused %s current: %+v", r.Name, r)
		}
	}

	resumed := time.Now()
	if err := c.Resume(follower); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStreamCurrent(ctx, "PAUSE"); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s resumed and current in %s", c.Name(follower), time.Since(resumed).Round(time.Millisecond))
	assertReplica(ctx, t, c, follower, "PAUSE", 20)
	readAll(ctx, t, s, 20)
}

// TestStateErrors: the signals refuse a server in the wrong state, by name.
func TestStateErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := natscluster.StartT(t, bin, 3)
	if err := c.Kill(2); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, server string
		do           func() error
	}{
		{"kill a killed server", "n3", func() error { return c.Kill(2) }},
		{"stop a killed server", "n3", func() error { return c.Stop(2, time.Second) }},
		{"pause a killed server", "n3", func() error { return c.Pause(ctx, 2) }},
		{"resume a running server", "n1", func() error { return c.Resume(0) }},
		{"restart a running server", "n1", func() error { return c.Restart(ctx, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.server) {
				t.Fatalf("error %q does not name %s", err, tc.server)
			}
		})
	}
	if err := c.WaitHealthy(ctx); err == nil {
		t.Fatal("WaitHealthy with a server down: no error")
	}
}
