package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// authorizationFile is the shipped nats-server authorization block.
const authorizationFile = "nats/authorization.conf"

// natsUsers are the users of authorizationFile, each named by the variable holding its public
// key (NKEY_<user>).
var natsUsers = []string{"DISPATCH", "RECOVER", "HANDLE_SETUP", "HANDLE_POD", "GATEWAY"}

// handlePod is the connection name of handle for the pod backend ("handle-"+GDR_BACKEND), in
// job mode and in setup mode alike.
var handlePod = "handle-" + string(taskassignment.BackendPod)

// natsConnName is the connection name each user's function passes to natsconn.Connect
// (functions/<function>/main.go, checked by TestNATSConnectionNames); it names the connection's
// reply subjects (natsconn.InboxPrefix), which the user's subscribe permission must match.
var natsConnName = map[string]string{
	"DISPATCH": "dispatch", "RECOVER": "recover", "GATEWAY": "gateway",
	"HANDLE_SETUP": handlePod, "HANDLE_POD": handlePod,
}

var testTD = spiffeid.RequireTrustDomainFromString("example.org")

// authorizedNATS is a nats-server started from an authorization block.
type authorizedNATS struct {
	url string
	// dir holds nats.conf and the JetStream store (js); server is the running server (wipe
	// replaces it).
	dir    string
	server **server.Server
	// owner is the test that started it, whose end stops whatever server restart started.
	owner testing.TB
	// seeds are the seed files per user, written as `nk -gen user -pubout` writes them (the
	// seed, then the public key): the content of a gdr-nats-<function> Secret.
	seeds map[string]string
	// keys are the users' public keys the server reads (natsKeys), by variable name
	// (NKEY_<USER>, NKEY_<USER>_NEXT during a rotation): restart writes them again.
	keys map[string]string
}

// startAuthorizedNATS runs nats-server on 127.0.0.1 with JetStream and the authorization block
// conf included the way deploy/README.md says, and a fresh nkey pair per user whose public key
// it finds in its environment (NKEY_<user>), as a deployed server does.
func startAuthorizedNATS(t testing.TB, conf string) authorizedNATS {
	t.Helper()
	return startAuthorizedNATSWith(t, conf, "", nil)
}

// startAuthorizedNATSWith is startAuthorizedNATS with extra lines of server configuration and
// more keys (variable name to public key) beside the fresh users'.
func startAuthorizedNATSWith(t testing.TB, conf, extra string, more map[string]string) authorizedNATS {
	t.Helper()
	dir := t.TempDir()
	srv := authorizedNATS{seeds: map[string]string{}, keys: map[string]string{}}
	maps.Copy(srv.keys, more)
	for _, u := range natsUsers {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		seed, err := kp.Seed()
		if err != nil {
			t.Fatal(err)
		}
		srv.keys["NKEY_"+u] = pub
		file := filepath.Join(dir, strings.ToLower(u)+".nk")
		if err := os.WriteFile(file, []byte(string(seed)+"\n"+pub+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		srv.seeds[u] = file
	}
	s := startNATSServer(t, t, dir, conf, extra, srv.keys, -1)
	srv.url, srv.dir, srv.server, srv.owner = s.ClientURL(), dir, &s, t
	return srv
}

// wipe stops the server, deletes its JetStream store (every stream, consumer and key-value
// bucket) and starts it again on the same port with the same configuration: NATS losing its
// data. Clients reconnect as to any restarted server.
func (s authorizedNATS) wipe(t testing.TB) {
	t.Helper()
	s.restart(t, "", true)
}

// restart stops the server and starts it again on the same port, with authorization as its
// included authorization.conf when not empty, the users' public keys read from the environment
// again (NKEY_<USER>, and NKEY_<USER>_NEXT during a rotation), and without its JetStream store
// when wipe.
func (s authorizedNATS) restart(t testing.TB, authorization string, wipe bool) {
	t.Helper()
	old := *s.server
	port := old.Addr().(*net.TCPAddr).Port
	old.Shutdown()
	old.WaitForShutdown()
	if wipe {
		if err := os.RemoveAll(filepath.Join(s.dir, "js")); err != nil {
			t.Fatal(err)
		}
	}
	if authorization != "" {
		if err := os.WriteFile(filepath.Join(s.dir, "authorization.conf"), []byte(natsKeys(s.keys, authorization)+authorization), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Stopped at the end of the test that started the first, not of the (sub)test restarting it.
	*s.server = startNATSServer(t, s.owner, s.dir, "", "", nil, port)
}

// runAuthorizedNATS runs nats-server (embedded, 127.0.0.1, JetStream in dir) with conf as its
// included authorization.conf and extra lines of configuration; the users' public keys are keys
// (natsKeys). It returns the client URL.
func runAuthorizedNATS(t testing.TB, dir, conf, extra string, keys map[string]string) string {
	t.Helper()
	return startNATSServer(t, t, dir, conf, extra, keys, -1).ClientURL()
}

// natsKeys are the keys (NKEY_<USER> to the user's public key) conf reads ($NKEY_<USER>) as
// nats-server configuration variables: a deployed server finds them in its environment, the tests'
// servers at the top of their authorization.conf, since the test binary's environment is shared
// by the tests running in parallel. Keys conf does not read are left out (nats-server refuses a
// variable nothing reads as an unknown field).
func natsKeys(keys map[string]string, conf string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if regexp.MustCompile(`\$` + k + `\b`).MatchString(conf) {
			fmt.Fprintf(&b, "%s: %q\n", k, keys[k])
		}
	}
	return b.String()
}

// startNATSServer is runAuthorizedNATS on port (-1: any free one), returning the server, which
// stops when owner ends; with conf and extra empty it starts from the configuration files already
// in dir.
func startNATSServer(t, owner testing.TB, dir, conf, extra string, keys map[string]string, port int) *server.Server {
	t.Helper()
	if conf != "" || extra != "" {
		if err := os.WriteFile(filepath.Join(dir, "authorization.conf"), []byte(natsKeys(keys, conf)+conf), 0o600); err != nil {
			t.Fatal(err)
		}
		mainConf := fmt.Sprintf("host: 127.0.0.1\nport: -1\njetstream { store_dir: %q }\n%s\ninclude ./authorization.conf\n", filepath.Join(dir, "js"), extra)
		if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(mainConf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("nats-server refuses %s: %v", authorizationFile, err)
	}
	opts.NoLog, opts.NoSigs, opts.Port = true, true, port
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	owner.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	if !s.JetStreamEnabled() {
		t.Fatal("nats-server without JetStream")
	}
	return s
}

// natsClient is one function's connection, recording the permissions violations the server
// reports on it (they arrive asynchronously, as -ERR).
type natsClient struct {
	user string
	nc   *nats.Conn
	js   jetstream.JetStream

	mu         sync.Mutex
	violations []string
}

// connect connects as user with its seed file through natsconn.Connect, under its function's
// connection name, exactly as a function with GDR_NATS_NKEY does (and so with that function's
// reply inbox prefix).
func (s authorizedNATS) connect(t testing.TB, user string) *natsClient {
	t.Helper()
	c := &natsClient{user: user}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, js, err := natsconn.Connect(ctx, natsconn.ConnSettings{URL: s.url, NKey: s.seeds[user]}, natsConnName[user])
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			c.mu.Lock()
			c.violations = append(c.violations, err.Error())
			c.mu.Unlock()
		}
	})
	c.nc, c.js = nc, js
	return c
}

// clean fails the test if the server reported any permissions violation on c: an allowed flow
// must not even touch a subject it may not use (some nats.go calls ignore a failed request, e.g.
// the deletion of an ordered consumer, and would hide a missing permission otherwise).
func (c *natsClient) clean(t *testing.T) {
	t.Helper()
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the async error callback of a last -ERR may still be queued
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.violations) > 0 {
		t.Errorf("%s: permissions violations in an allowed flow:\n%s", c.user, strings.Join(c.violations, "\n"))
	}
	c.violations = nil
}

// denied runs call, which must fail, and requires the server to report a permissions violation
// for subject (publish or subscription) on c. Denied requests get no answer, so call gets a short
// deadline.
func (c *natsClient) denied(t *testing.T, what, subject string, call func(ctx context.Context) error) {
	t.Helper()
	c.mu.Lock()
	c.violations = nil
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := call(ctx); err == nil {
		t.Errorf("%s: %s succeeded; want it refused", c.user, what)
		return
	}
	// The server quotes the subject; a prefix is enough for subjects with a generated part
	// (an ordered consumer's name).
	quoted := `"` + subject
	deadline := time.Now().Add(2 * time.Second)
	for {
		c.mu.Lock()
		v := slices.Clone(c.violations)
		c.mu.Unlock()
		if slices.ContainsFunc(v, func(s string) bool { return strings.Contains(s, quoted) }) {
			c.mu.Lock()
			c.violations = nil
			c.mu.Unlock()
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %s failed without a permissions violation for %s (violations: %v)", c.user, what, quoted, v)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// subscribeDenied is denied for a core subscription to subject; while it is attempted, poke
// publishes on the subject (as another user), so a subscription that slipped through would
// receive it.
func (c *natsClient) subscribeDenied(t *testing.T, subject string, poke func()) {
	t.Helper()
	c.denied(t, "subscribe to "+subject, subject, func(ctx context.Context) error {
		sub, err := c.nc.SubscribeSync(subject)
		if err != nil {
			return err
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := c.nc.Flush(); err != nil {
			return err
		}
		poke()
		m, err := sub.NextMsgWithContext(ctx)
		if err == nil {
			return fmt.Errorf("received %s", m.Subject) // slipped through: no violation follows
		}
		return err
	})
}

func testAssignment(t *testing.T, taskID int64) taskassignment.Assignment {
	t.Helper()
	id, err := taskidentity.New(testTD, "owner/repo", "build", taskID)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: taskID, Pool: "linux"}, id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func readAuthorization(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(authorizationFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var payloadKey = secretkey.Key(bytes.Repeat([]byte{7}, 32))

// signer is the assignment signing key of dispatch and recover (GDR_ASSIGNMENT_SIGNING_KEY); its
// Open is what handle's keyring (GDR_ASSIGNMENT_VERIFY_KEYS) does to every message.
var signer = jetstreamenv.Signer()

// signedQueue is the assignment queue of js as the functions open it: signed, so that Publish and
// Queued reach the server (a queue without a signer refuses both before sending anything, which
// would hide a missing or excess permission).
func signedQueue(js jetstream.JetStream) *assignmentqueue.Queue {
	return assignmentqueue.New(js, "").SignedBy(signer)
}

// Keys of runHandleJob's want for the messages that carry no assignment: one nobody signed
// (handle terminates it as "unauthenticated assignment") and one signed that does not decode
// ("malformed assignment").
const (
	unauthenticatedMsg = "(unauthenticated)"
	malformedMsg       = "(malformed)"
)

// publishPoison publishes, as dispatch (d), one message of each kind handle must terminate: bytes
// nobody signed (what a forger with publish rights would send) and a signed non-assignment.
func publishPoison(ctx context.Context, t *testing.T, d *natsClient) {
	t.Helper()
	subject := assignmentqueue.Subject(taskassignment.BackendPod)
	if _, err := d.js.Publish(ctx, subject, []byte("not an assignment")); err != nil {
		t.Fatal(err)
	}
	sealed, err := signer.Seal([]byte("not an assignment"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.js.Publish(ctx, subject, sealed); err != nil {
		t.Fatal(err)
	}
}

const bucket = assignmentqueue.DefaultPayloadBucket

// endedBucket is the end-mark bucket beside it.
var endedBucket = assignmentqueue.EndingsBucket(bucket)

// TestNATSAuthorization runs, as each user of the shipped authorization block, the JetStream calls
// its function makes (functions/<name>/main.go and the shared package it drives, in that order),
// and the calls it must never be able to make.
func TestNATSAuthorization(t *testing.T) {
	srv := startAuthorizedNATS(t, readAuthorization(t))
	a1, a2, a3, a4, a5 := testAssignment(t, 1), testAssignment(t, 2), testAssignment(t, 3), testAssignment(t, 4), testAssignment(t, 5)
	// a6: rejected by handle (a permanent error); a7: a message past MaxDeliver, for recover.
	a6, a7 := testAssignment(t, 6), testAssignment(t, 7)

	if !t.Run("no credentials", func(t *testing.T) {
		// An executor (a job's own code) has no key: it cannot even connect.
		if nc, err := nats.Connect(srv.url); err == nil {
			nc.Close()
			t.Fatal("a connection without credentials was accepted")
		} else if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Fatalf("err = %v, want an authorization violation", err)
		}
		// Nor with a key of its own making.
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		nc, err := nats.Connect(srv.url, nats.Nkey(pub, kp.Sign))
		if err == nil {
			nc.Close()
			t.Fatal("an unknown nkey was accepted")
		}
	}) {
		return
	}

	// handle-setup (GDR_MODE=setup): functions/handle serve(): EnsureStream, EnsureRejections,
	// OpenConsumer.
	setup := srv.connect(t, "HANDLE_SETUP")
	if !t.Run("handle-setup", func(t *testing.T) {
		ctx := flowContext(t)
		runHandleSetup(ctx, t, setup)
		// Even with the signing key, the server refuses the publish.
		setup.denied(t, "publish an assignment", "ci.assignment.pod", func(ctx context.Context) error {
			_, err := signedQueue(setup.js).Publish(ctx, a1)
			return err
		})
		setup.denied(t, "open the payload bucket", "$JS.API.STREAM.INFO.KV_CI_TASKS", func(ctx context.Context) error {
			_, err := assignmentqueue.OpenPayloads(ctx, setup.js, bucket, payloadKey)
			return err
		})
	}) {
		return
	}

	// dispatch: functions/dispatch newService() (EnsureStream, EnsureRejections, EnsurePayloads,
	// which also creates the payload bucket's durable consumer "gateway", the gateway's scale
	// signal, and replaces old deletion markers), then shared/dispatcher: IDs, Started, Put,
	// Publish, Delete (purges whose markers expire: a message TTL).
	dispatch := srv.connect(t, "DISPATCH")
	var dq *assignmentqueue.Queue
	var dp *assignmentqueue.Payloads
	if !t.Run("dispatch", func(t *testing.T) {
		ctx := flowContext(t)
		dq = signedQueue(dispatch.js)
		if err := dq.EnsureStream(ctx); err != nil {
			t.Fatal(err)
		}
		if err := dq.EnsureRejections(ctx); err != nil {
			t.Fatal(err)
		}
		var err error
		if dp, err = assignmentqueue.EnsurePayloads(ctx, dispatch.js, assignmentqueue.Bucket{Name: bucket, TTL: 4 * time.Hour}, payloadKey); err != nil {
			t.Fatal(err)
		}
		if _, err = assignmentqueue.EnsureEndings(ctx, dispatch.js, assignmentqueue.Bucket{Name: endedBucket, TTL: 4 * time.Hour}); err != nil {
			t.Fatal(err)
		}
		if ids, err := dp.IDs(ctx); err != nil || len(ids) != 0 {
			t.Fatalf("IDs = %v, %v", ids, err)
		}
		for _, a := range []taskassignment.Assignment{a1, a2, a3, a4} {
			if err := dp.Put(ctx, a.ID, &runnerv1.Task{Id: a.Task.ID}); err != nil {
				t.Fatal(err)
			}
		}
		// a2 stays an orphan (a crash between payload and message) for recover; a4 is a task
		// Gitea ended while it waited, whose payload dispatch deletes below.
		for _, a := range []taskassignment.Assignment{a1, a3, a6} {
			if _, err := dq.Publish(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		// Messages for handle to terminate: unsigned, and signed but no assignment.
		publishPoison(ctx, t, dispatch)
		if started, err := dp.Started(ctx, a1.ID); err != nil || started {
			t.Fatalf("Started = %v, %v", started, err)
		}
		ids, err := dp.IDs(ctx)
		if err != nil || !slices.Equal(ids, []string{a1.ID, a2.ID, a3.ID, a4.ID}) {
			t.Fatalf("IDs = %v, %v", ids, err)
		}
		if err := dp.Delete(ctx, a4.ID); err != nil {
			t.Fatal(err)
		}
		// dispatch started again: EnsurePayloads converges the consumer it made and replaces
		// the deletion marker just left (a purge expecting that marker as the key's last).
		if dp, err = assignmentqueue.EnsurePayloads(ctx, dispatch.js, assignmentqueue.Bucket{Name: bucket, TTL: 4 * time.Hour}, payloadKey); err != nil {
			t.Fatal(err)
		}
		// `dispatch status` lists the payloads with their store times, reading none.
		if stored, err := dp.Stored(ctx); err != nil || len(stored) != 3 {
			t.Fatalf("Stored = %v, %v", stored, err)
		}
		// serve's metrics read each backend's consumer on scrape (metrics.Consumers).
		if info, err := metrics.JetStreamConsumerInfo(dispatch.js)(ctx, "CI_RUNNER", "pod"); err != nil || info.Name != "pod" {
			t.Fatalf("dispatch reads the pod consumer's state: %v, %v", info, err)
		}
		dispatch.clean(t)
		dispatch.denied(t, "consume the queue", "$JS.API.CONSUMER.MSG.NEXT.CI_RUNNER.pod", func(ctx context.Context) error {
			_, err := dispatch.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT.CI_RUNNER.pod", []byte(`{"batch":1}`))
			return err
		})
	}) {
		return
	}

	// handle in job mode (functions/handle serve(): only Queue.Consumer, the consumer
	// handle-setup made; then shared/trigger/pull Assignments.Run: Fetch, and per message Metadata and Ack,
	// NakWithDelay / Nak, or TermWithReason: poison, or a rejection).
	handle := srv.connect(t, "HANDLE_POD")
	if !t.Run("handle-pod", func(t *testing.T) {
		ctx := flowContext(t)
		runHandleJob(ctx, t, handle, map[string]string{a1.ID: "ack", a3.ID: "nak", a6.ID: "reject", unauthenticatedMsg: "term", malformedMsg: "term"})
		runHandleJob(ctx, t, handle, map[string]string{a3.ID: "ack"})
		// Worker.Accept's end marks (functions/handle serve(): OpenEndings; Accept: Ended),
		// which recover writes.
		marker := srv.connect(t, "RECOVER")
		re, err := assignmentqueue.OpenEndings(ctx, marker.js, endedBucket)
		if err != nil {
			t.Fatal(err)
		}
		if err := re.MarkEnded(ctx, a1.ID); err != nil {
			t.Fatal(err)
		}
		marker.clean(t)
		endings, err := assignmentqueue.OpenEndings(ctx, handle.js, endedBucket)
		if err != nil {
			t.Fatal(err)
		}
		for id, want := range map[string]bool{a1.ID: true, a5.ID: false} {
			if ended, err := endings.Ended(ctx, id); err != nil || ended != want {
				t.Fatalf("Ended(%s) = %v, %v; want %v", id, ended, err, want)
			}
		}
		handleForbidden(t, handle, dispatch, dp, a5)
	}) {
		return
	}

	// gateway: functions/gateway serve() (OpenPayloads), shared/gateway FetchTask: Get,
	// MarkStarted, Unmark.
	gateway := srv.connect(t, "GATEWAY")
	if !t.Run("gateway", func(t *testing.T) {
		ctx := flowContext(t)
		p, err := assignmentqueue.OpenPayloads(ctx, gateway.js, bucket, payloadKey)
		if err != nil {
			t.Fatal(err)
		}
		task, err := p.Get(ctx, a1.ID)
		if err != nil || task.GetId() != a1.Task.ID {
			t.Fatalf("Get = %v, %v", task, err)
		}
		if err := p.MarkStarted(ctx, a1.ID); err != nil {
			t.Fatal(err)
		}
		// Its pickup histogram reads when the payload was stored.
		if at, err := p.StoredAt(ctx, a1.ID); err != nil || at.IsZero() {
			t.Fatalf("StoredAt = %v, %v", at, err)
		}
		gateway.clean(t)
		if started, err := dp.Started(ctx, a1.ID); err != nil || !started {
			t.Fatalf("dispatch sees Started = %v, %v after the gateway's mark", started, err)
		}
		// Unmark: a fetch that raced recover's delete removes its mark (shared/gateway's
		// stillBound); then the mark again, for what follows.
		if err := p.Unmark(ctx, a1.ID); err != nil {
			t.Fatal(err)
		}
		gateway.clean(t)
		if started, err := dp.Started(ctx, a1.ID); err != nil || started {
			t.Fatalf("dispatch sees Started = %v, %v after the gateway's Unmark", started, err)
		}
		if err := p.MarkStarted(ctx, a1.ID); err != nil {
			t.Fatal(err)
		}
		gateway.denied(t, "publish an assignment", "ci.assignment.pod", func(ctx context.Context) error {
			_, err := signedQueue(gateway.js).Publish(ctx, a5)
			return err
		})
		gateway.denied(t, "overwrite a payload", "$KV.CI_TASKS."+a1.ID, func(ctx context.Context) error {
			return p.Put(ctx, a1.ID, &runnerv1.Task{Id: 99})
		})
		gateway.denied(t, "read the queue", "$JS.API.STREAM.INFO.CI_RUNNER", func(ctx context.Context) error {
			_, _, err := signedQueue(gateway.js).Queued(ctx, taskassignment.BackendPod, testTD)
			return err
		})
		gateway.denied(t, "list payloads", "$JS.API.CONSUMER.CREATE.KV_CI_TASKS", func(ctx context.Context) error {
			_, err := p.IDs(ctx)
			return err
		})
		// Nor touch its own scale signal, which dispatch keeps.
		gateway.denied(t, "delete its scale signal", "$JS.API.CONSUMER.DELETE.KV_CI_TASKS."+assignmentqueue.GatewayConsumer, func(ctx context.Context) error {
			return gateway.js.DeleteConsumer(ctx, "KV_CI_TASKS", assignmentqueue.GatewayConsumer)
		})
		// The replies to the gateway's reads carry the (sealed) payloads: handle cannot
		// subscribe to the gateway's inbox to take them as the gateway reads.
		handle.subscribeDenied(t, natsconn.InboxPrefix("gateway")+".>", func() {
			if _, err := p.Get(ctx, a1.ID); err != nil {
				t.Errorf("gateway Get: %v", err)
			}
		})
		gateway.clean(t)
	}) {
		return
	}

	// recover: functions/recover build() (OpenPayloads), shared/recoverer Run: Delete of finished
	// tasks, IDs, Queued, Get (rebuild), Publish (re-publish an orphan).
	recoverC := srv.connect(t, "RECOVER")
	if !t.Run("recover", func(t *testing.T) {
		ctx := flowContext(t)
		if _, err := dq.Publish(ctx, a5); err != nil { // still queued during the pass
			t.Fatal(err)
		}
		p, err := assignmentqueue.OpenPayloads(ctx, recoverC.js, bucket, payloadKey)
		if err != nil {
			t.Fatal(err)
		}
		q := signedQueue(recoverC.js)
		// Worker.Finish marks an assignment ended before it deletes its executor; Delete
		// then removes the payload and leaves the mark, which IDs does not list.
		e, err := assignmentqueue.OpenEndings(ctx, recoverC.js, endedBucket)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.MarkEnded(ctx, a1.ID); err != nil {
			t.Fatal(err)
		}
		if err := p.Delete(ctx, a1.ID); err != nil {
			t.Fatal(err)
		}
		ids, err := p.IDs(ctx)
		if err != nil || !slices.Equal(ids, []string{a2.ID, a3.ID}) {
			t.Fatalf("IDs = %v, %v", ids, err)
		}
		queued, malformed, err := q.Queued(ctx, taskassignment.BackendPod, testTD)
		if err != nil || malformed != 0 || len(queued) != 1 || !queued[a5.ID] {
			t.Fatalf("Queued = %v, %d, %v; want only %s", queued, malformed, err, a5.ID)
		}
		if task, err := p.Get(ctx, a2.ID); err != nil || task.GetId() != a2.Task.ID {
			t.Fatalf("Get = %v, %v", task, err)
		}
		// The Knative path (GDR_PUBLISH=cloudevents): the orphan step reads when an assignment
		// was last sent and marks a re-send; DeadLetter reads the started mark.
		stored, err := p.LastSent(ctx, a2.ID)
		if err != nil {
			t.Fatalf("LastSent before a re-send: %v", err)
		}
		if err := p.MarkSent(ctx, a2.ID); err != nil {
			t.Fatalf("MarkSent: %v", err)
		}
		if last, err := p.LastSent(ctx, a2.ID); err != nil || last.Before(stored) {
			t.Fatalf("LastSent after a re-send = %v, %v; want at or after %v", last, err, stored)
		}
		if _, err := p.Started(ctx, a2.ID); err != nil {
			t.Fatalf("Started: %v", err)
		}
		if _, err := q.Publish(ctx, a2); err != nil {
			t.Fatal(err)
		}
		// shared/recoverer Drain: the rejection stream holds handle's three terminations (two
		// poison, one rejection) and nothing forged; each is removed once acted on.
		entries, err := q.Rejections(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		var reasons []string
		for _, e := range entries {
			reasons = append(reasons, e.Reason)
			if err := q.RemoveRejection(ctx, e.Seq); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(reasons)
		if want := []string{"malformed assignment", taskassignment.RejectedReason(a6.ID, "runner pool is not a pod pool"), "unauthenticated assignment"}; !slices.Equal(reasons, want) {
			t.Fatalf("captured terminations %q, want %q", reasons, want)
		}
		// A message past MaxDeliver: read back and deleted from the queue.
		ack, err := dq.Publish(ctx, a7)
		if err != nil {
			t.Fatal(err)
		}
		if a, found, err := q.ExhaustedAssignment(ctx, ack.Sequence, testTD); err != nil || !found || a.ID != a7.ID {
			t.Fatalf("ExhaustedAssignment = %s, %v, %v", a.ID, found, err)
		}
		if err := q.DeleteMessage(ctx, ack.Sequence); err != nil {
			t.Fatal(err)
		}
		// `recover status` (functions/recover status): the payloads, their started marks and
		// run URLs (Get), and the pod consumer's state.
		r, err := poolstatus.Read(ctx, poolstatus.Source{Payloads: p, Tasks: p,
			Consumers: metrics.JetStreamConsumerInfo(recoverC.js).Backlogs(), Stream: assignmentqueue.DefaultStream},
			runnerpool.Pools{{Name: a2.Task.Pool, Backend: taskassignment.BackendPod, Capacity: 5}}, time.Now())
		if err != nil || len(r.Pools) != 1 || r.Pools[0].InFlight != 2 || r.Pools[0].Queued < 0 {
			t.Fatalf("recover status = %+v, %v; want a2 and a3 in flight and the pod consumer read", r, err)
		}
		recoverC.clean(t)
		recoverC.denied(t, "consume the queue", "$JS.API.CONSUMER.CREATE.CI_RUNNER.pod.ci.assignment.pod", func(ctx context.Context) error {
			_, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 10)
			return err
		})
		recoverC.denied(t, "reconfigure the stream", "$JS.API.STREAM.UPDATE.CI_RUNNER", func(ctx context.Context) error {
			_, err := recoverC.js.UpdateStream(ctx, jetstream.StreamConfig{Name: assignmentqueue.DefaultStream, Subjects: []string{"ci.assignment.>"}})
			return err
		})
	}) {
		return
	}

	// The re-published orphan reaches handle like any other assignment.
	if !t.Run("handle takes the re-published orphan", func(t *testing.T) {
		ctx := flowContext(t)
		runHandleJob(ctx, t, handle, map[string]string{a2.ID: "ack", a5.ID: "ack"})
	}) {
		return
	}

	t.Run("inboxes", func(t *testing.T) {
		inboxesDenied(t, dispatch, []*natsClient{setup, dispatch, handle, gateway, recoverC})
	})
}

// inboxesDenied checks that no client may subscribe to the shared _INBOX.> or to the inbox of
// another function's connection (each user may read its own replies only). Dispatch (d) pokes
// each inbox meanwhile: a request whose reply JetStream sends there, which a subscription that
// slipped through would receive.
func inboxesDenied(t *testing.T, d *natsClient, clients []*natsClient) {
	prefixes := []string{"_INBOX"}
	for _, u := range natsUsers {
		if p := natsconn.InboxPrefix(natsConnName[u]); !slices.Contains(prefixes, p) {
			prefixes = append(prefixes, p)
		}
	}
	for _, c := range clients {
		own := natsconn.InboxPrefix(natsConnName[c.user])
		t.Run(c.user, func(t *testing.T) {
			t.Parallel()
			for _, p := range prefixes {
				if p == own {
					continue
				}
				c.subscribeDenied(t, p+".>", func() {
					if err := d.nc.PublishRequest("$JS.API.INFO", p+".poke", nil); err != nil {
						t.Error(err)
					}
				})
			}
			c.clean(t)
		})
	}
}

// TestNATSConnectionNames ties natsConnName, and so the subscribe permission of each user, to
// the name each function passes to natsconn.Connect: a renamed connection would take its replies
// on an inbox its user may not read.
func TestNATSConnectionNames(t *testing.T) {
	want := map[string]string{ // function: the name argument of its natsconn.Connect
		"dispatch": `"dispatch"`, "recover": `"recover"`, "gateway": `"gateway"`,
		"handle": `"handle-"+cfg.Backend`, // handlePod for GDR_BACKEND=pod, in setup and job mode
	}
	for _, u := range natsUsers {
		if _, ok := natsConnName[u]; !ok {
			t.Errorf("user %s has no connection name", u)
		}
	}
	if natsConnName["HANDLE_SETUP"] != handlePod || natsConnName["HANDLE_POD"] != handlePod {
		t.Errorf("handle-setup and handle-pod connect as %q, not %q and %q", handlePod, natsConnName["HANDLE_SETUP"], natsConnName["HANDLE_POD"])
	}
	call := regexp.MustCompile(`natsconn\.Connect\((.*)\)`)
	for fn, name := range want {
		files, err := filepath.Glob(filepath.Join("..", "functions", fn, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		var found []string
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range call.FindAllStringSubmatch(string(b), -1) {
				args := strings.Split(m[1], ", ")
				found = append(found, args[len(args)-1])
			}
		}
		if len(found) == 0 {
			t.Errorf("functions/%s: no natsconn.Connect call", fn)
		}
		for _, got := range found {
			if got != name {
				t.Errorf("functions/%s connects to NATS as %s, want %s (deploy/nats/authorization.conf allows its user the replies of that name only)", fn, got, name)
			}
		}
	}
}

// flowContext bounds one function's flow: a request the server drops for a missing permission
// waits for its deadline.
func flowContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// runHandleSetup is handle's setup mode (functions/handle serve(): EnsureStream,
// EnsureRejections, OpenConsumer) as client c, which must be allowed all of it.
func runHandleSetup(ctx context.Context, t *testing.T, c *natsClient) {
	t.Helper()
	q := assignmentqueue.New(c.js, "")
	if err := q.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.EnsureRejections(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 10); err != nil {
		t.Fatal(err)
	}
	c.clean(t)
}

// runHandleJob is one job-mode run of handle (functions/handle serve() and shared/handler
// Assignments.Run) as client c: it binds the existing consumer (Queue.Consumer, nothing else: job mode
// neither creates nor changes the stream or the consumer), fetches exactly len(want) messages and
// settles each as want says for its assignment ID (unauthenticatedMsg, malformedMsg for the
// messages without one): ack, nak (NakWithDelay, then a plain Nak on the redelivery) or term,
// with the reason handle gives. Nothing may be left unsettled.
func runHandleJob(ctx context.Context, t *testing.T, c *natsClient, want map[string]string) {
	t.Helper()
	consumer, err := assignmentqueue.New(c.js, "").Consumer(ctx, taskassignment.BackendPod)
	if err != nil {
		t.Fatal(err)
	}
	fetchCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	msgs, err := consumer.Fetch(len(want), jetstream.FetchContext(fetchCtx))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for msg := range msgs.Messages() {
		if _, err := msg.Metadata(); err != nil {
			t.Errorf("metadata: %v", err)
		}
		// As shared/handler decodes: authenticate, then decode.
		id, reason := unauthenticatedMsg, "unauthenticated assignment"
		if opened, err := signer.Open(msg.Data()); err == nil {
			id, reason = malformedMsg, "malformed assignment"
			if a, err := taskassignment.Decode(opened, testTD); err == nil {
				id = a.ID
			}
		}
		seen[id] = true
		switch want[id] {
		case "ack":
			err = msg.Ack()
		case "nak":
			if err = msg.NakWithDelay(time.Millisecond); err == nil {
				// Redelivered at once: a plain Nak (the shutdown path) on it too.
				var again jetstream.Msg
				if again, err = consumer.Next(jetstream.FetchMaxWait(5 * time.Second)); err == nil {
					err = again.Nak()
				}
			}
		case "term":
			err = msg.TermWithReason(reason)
		case "reject":
			err = msg.TermWithReason(taskassignment.RejectedReason(id, "runner pool is not a pod pool"))
		default:
			t.Errorf("unexpected message %q", id)
		}
		if err != nil {
			t.Errorf("settle %q: %v", id, err)
		}
	}
	if err := msgs.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("fetch: %v", err)
	}
	for id := range want {
		if !seen[id] {
			t.Errorf("message %q not delivered", id)
		}
	}
	c.clean(t)
}

// handleForbidden checks what handle (job mode, client c) must never do, with dispatch (d, its
// payload store dp) writing meanwhile so that a permission that slipped through would show.
func handleForbidden(t *testing.T, c, d *natsClient, dp *assignmentqueue.Payloads, forged taskassignment.Assignment) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// With the signing key, so that what refuses the publish is the server, not the missing key.
	q := signedQueue(c.js)
	// The attack this deployment closes: a forged assignment for another task.
	c.denied(t, "publish an assignment", "ci.assignment.pod", func(ctx context.Context) error {
		_, err := q.Publish(ctx, forged)
		return err
	})
	c.denied(t, "publish for another backend", "ci.assignment.process", func(ctx context.Context) error {
		f := forged
		f.Backend = taskassignment.BackendProcess
		_, err := q.Publish(ctx, f)
		return err
	})
	// handle may open the end-mark bucket, never the payload bucket, nor read a payload, even
	// with the payload key.
	c.denied(t, "open the payload bucket", "$JS.API.STREAM.INFO.KV_CI_TASKS", func(ctx context.Context) error {
		p, err := assignmentqueue.OpenPayloads(ctx, c.js, bucket, payloadKey)
		if err != nil {
			return err
		}
		_, err = p.Get(ctx, forged.ID)
		return err
	})
	c.denied(t, "read a started mark", "$JS.API.DIRECT.GET.KV_CI_TASKS.$KV.CI_TASKS.started."+forged.ID, func(ctx context.Context) error {
		_, err := c.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_CI_TASKS.$KV.CI_TASKS.started."+forged.ID, nil)
		return err
	})
	c.denied(t, "read the payload stream by sequence", "$JS.API.DIRECT.GET.KV_CI_TASKS", func(ctx context.Context) error {
		_, err := c.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_CI_TASKS", []byte(`{"seq":1}`))
		return err
	})
	c.denied(t, "mark a task ended", "$KV.CI_TASKS_ENDED."+forged.ID, func(ctx context.Context) error {
		e, err := assignmentqueue.OpenEndings(ctx, c.js, endedBucket)
		if err != nil {
			return err
		}
		return e.MarkEnded(ctx, forged.ID)
	})
	c.denied(t, "read a payload directly", "$JS.API.DIRECT.GET.KV_CI_TASKS.$KV.CI_TASKS."+forged.ID, func(ctx context.Context) error {
		_, err := c.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_CI_TASKS.$KV.CI_TASKS."+forged.ID, nil)
		return err
	})
	c.denied(t, "read the payload stream", "$JS.API.STREAM.MSG.GET.KV_CI_TASKS", func(ctx context.Context) error {
		_, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_CI_TASKS", []byte(`{"seq":1}`))
		return err
	})
	c.denied(t, "create a consumer on the payload stream", "$JS.API.CONSUMER.CREATE.KV_CI_TASKS.x", func(ctx context.Context) error {
		_, err := c.js.CreateOrUpdateConsumer(ctx, "KV_CI_TASKS", jetstream.ConsumerConfig{Name: "x"})
		return err
	})
	c.denied(t, "write a payload", "$KV.CI_TASKS."+forged.ID, func(ctx context.Context) error {
		_, err := c.js.Publish(ctx, "$KV.CI_TASKS."+forged.ID, []byte("x"))
		return err
	})
	c.subscribeDenied(t, "$KV.CI_TASKS.>", func() {
		_ = dp.Put(ctx, forged.ID, &runnerv1.Task{Id: forged.Task.ID})
	})
	if err := dp.Delete(ctx, forged.ID); err != nil {
		t.Fatal(err)
	}
	c.subscribeDenied(t, "ci.assignment.>", func() {
		_ = d.nc.Publish("ci.assignment.none", []byte("x")) // a core publish no stream takes
	})
	c.denied(t, "open another backend's consumer", "$JS.API.CONSUMER.INFO.CI_RUNNER.process", func(ctx context.Context) error {
		_, err := q.Consumer(ctx, taskassignment.BackendProcess)
		return err
	})
	c.denied(t, "create another backend's consumer", "$JS.API.CONSUMER.CREATE.CI_RUNNER.process.ci.assignment.process", func(ctx context.Context) error {
		_, err := q.OpenConsumer(ctx, taskassignment.BackendProcess, 10)
		return err
	})
	// Job mode binds the consumer handle-setup made and converges nothing: no stream info,
	// update or consumer create, not even for its own backend.
	c.denied(t, "converge the stream (EnsureStream)", "$JS.API.STREAM.INFO.CI_RUNNER", func(ctx context.Context) error {
		return q.EnsureStream(ctx)
	})
	c.denied(t, "converge its own consumer (OpenConsumer)", "$JS.API.CONSUMER.CREATE.CI_RUNNER.pod.ci.assignment.pod", func(ctx context.Context) error {
		_, err := q.OpenConsumer(ctx, taskassignment.BackendPod, 10)
		return err
	})
	// What a stream update would allow: source the payload bucket into handle's own queue
	// subject and read the (sealed) payloads through its consumer.
	c.denied(t, "source the payload bucket into the queue", "$JS.API.STREAM.UPDATE.CI_RUNNER", func(ctx context.Context) error {
		_, err := c.js.UpdateStream(ctx, jetstream.StreamConfig{
			Name: assignmentqueue.DefaultStream, Subjects: []string{"ci.assignment.>"},
			Storage: jetstream.FileStorage, Retention: jetstream.WorkQueuePolicy, Duplicates: assignmentqueue.DuplicateWindow,
			Sources: []*jetstream.StreamSource{{Name: "KV_CI_TASKS", SubjectTransforms: []jetstream.SubjectTransformConfig{
				{Source: "$KV.CI_TASKS.*", Destination: "ci.assignment.pod"}}}},
		})
		return err
	})
	if s, err := d.js.Stream(ctx, assignmentqueue.DefaultStream); err != nil {
		t.Fatal(err)
	} else if src := s.CachedInfo().Config.Sources; len(src) != 0 {
		t.Errorf("stream %s has sources %v after handle's refused update", assignmentqueue.DefaultStream, src)
	}
	// A forged rejection: a termination advisory naming another task, which recover would fail.
	forgedAdvisory := "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.CI_RUNNER.pod"
	c.denied(t, "forge a rejection", forgedAdvisory, func(ctx context.Context) error {
		data := []byte(`{"type":"io.nats.jetstream.advisory.v1.terminated","stream":"CI_RUNNER","consumer":"pod","stream_seq":1,"reason":"` +
			taskassignment.RejectedReason(forged.ID, "forged") + `"}`)
		_, err := c.js.Publish(ctx, forgedAdvisory, data)
		return err
	})
	c.denied(t, "forge an exhausted delivery", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.CI_RUNNER.pod", func(ctx context.Context) error {
		_, err := c.js.Publish(ctx, "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.CI_RUNNER.pod", []byte(`{}`))
		return err
	})
	c.denied(t, "read the rejection stream", "$JS.API.STREAM.INFO.CI_RUNNER_REJECTED", func(ctx context.Context) error {
		_, err := q.Rejections(ctx, 0)
		return err
	})
	c.denied(t, "remove a rejection", "$JS.API.STREAM.MSG.DELETE.CI_RUNNER_REJECTED", func(ctx context.Context) error {
		_, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.DELETE.CI_RUNNER_REJECTED", []byte(`{"seq":1}`))
		return err
	})
	c.denied(t, "delete a queued message", "$JS.API.STREAM.MSG.DELETE.CI_RUNNER", func(ctx context.Context) error {
		_, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.DELETE.CI_RUNNER", []byte(`{"seq":1}`))
		return err
	})
	c.denied(t, "converge the rejection stream", "$JS.API.STREAM.INFO.CI_RUNNER_REJECTED", func(ctx context.Context) error {
		return q.EnsureRejections(ctx)
	})
	c.denied(t, "purge the queue", "$JS.API.STREAM.PURGE.CI_RUNNER", func(ctx context.Context) error {
		_, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE.CI_RUNNER", nil)
		return err
	})
	c.denied(t, "delete the queue", "$JS.API.STREAM.DELETE.CI_RUNNER", func(ctx context.Context) error {
		return c.js.DeleteStream(ctx, assignmentqueue.DefaultStream)
	})
}

// TestNATSAuthorizationDispatchFirst starts dispatch before handle-setup on a fresh server, which
// the apply order allows (both converge the stream): dispatch then creates the stream and its
// rejection stream (its STREAM.CREATE.CI_RUNNER and STREAM.CREATE.CI_RUNNER_REJECTED, which
// TestNATSAuthorization, with handle-setup first, never needs) and the bucket, and handle-setup
// only updates both streams and adds the consumer. Until handle-setup
// has run, a handle-pod run finds no consumer (and creates none): that is why handle-setup runs
// first.
func TestNATSAuthorizationDispatchFirst(t *testing.T) {
	srv := startAuthorizedNATS(t, readAuthorization(t))
	ctx := flowContext(t)
	dispatch := srv.connect(t, "DISPATCH")
	dq := signedQueue(dispatch.js)
	if err := dq.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	if err := dq.EnsureRejections(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := assignmentqueue.EnsurePayloads(ctx, dispatch.js, assignmentqueue.Bucket{Name: bucket, TTL: 4 * time.Hour}, payloadKey); err != nil {
		t.Fatal(err)
	}
	if _, err := assignmentqueue.EnsureEndings(ctx, dispatch.js, assignmentqueue.Bucket{Name: endedBucket, TTL: 4 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	a := testAssignment(t, 1)
	if _, err := dq.Publish(ctx, a); err != nil {
		t.Fatal(err)
	}
	dispatch.clean(t)

	handle := srv.connect(t, "HANDLE_POD")
	if _, err := assignmentqueue.New(handle.js, "").Consumer(ctx, taskassignment.BackendPod); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("handle-pod before handle-setup: Consumer err = %v, want %v", err, jetstream.ErrConsumerNotFound)
	}
	handle.clean(t)

	setup := srv.connect(t, "HANDLE_SETUP")
	runHandleSetup(ctx, t, setup)

	runHandleJob(ctx, t, handle, map[string]string{a.ID: "ack"})
}

// TestNATSSubjectFormats covers the subjects whose shape nats-server can change: acks and
// flow-control replies, in the v1 format (the default) and the v2 format (feature flag
// js_ack_fc_v2: $JS.ACK.<domain>.<account hash>.<stream>..., $JS.FC.<domain>.<account hash>...),
// so the file keeps working when v2 becomes the default. Flow control needs an ordered consumer
// to deliver more than 1 MiB (half of its 2 MiB window): a bucket of 12000 keys does.
func TestNATSSubjectFormats(t *testing.T) {
	for _, v2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("js_ack_fc_v2=%v", v2), func(t *testing.T) {
			srv := startAuthorizedNATSWith(t, readAuthorization(t), fmt.Sprintf("feature_flags { js_ack_fc_v2: %v }", v2), nil)
			ctx := flowContext(t)
			setup := srv.connect(t, "HANDLE_SETUP")
			sq := assignmentqueue.New(setup.js, "")
			if err := sq.EnsureStream(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := sq.OpenConsumer(ctx, taskassignment.BackendPod, 10); err != nil {
				t.Fatal(err)
			}
			dispatch := srv.connect(t, "DISPATCH")
			dq := signedQueue(dispatch.js)
			a1, a2 := testAssignment(t, 1), testAssignment(t, 2)
			for _, a := range []taskassignment.Assignment{a1, a2} {
				if _, err := dq.Publish(ctx, a); err != nil {
					t.Fatal(err)
				}
			}
			publishPoison(ctx, t, dispatch)
			handle := srv.connect(t, "HANDLE_POD")
			runHandleJob(ctx, t, handle, map[string]string{a1.ID: "ack", a2.ID: "nak", unauthenticatedMsg: "term", malformedMsg: "term"})
			runHandleJob(ctx, t, handle, map[string]string{a2.ID: "ack"})
			if n, err := assignmentqueue.New(handle.js, "").Outstanding(ctx, taskassignment.BackendPod); err != nil || n != 0 {
				t.Fatalf("outstanding after the runs: %d, %v; want everything settled", n, err)
			}
			handle.clean(t)

			dp, err := assignmentqueue.EnsurePayloads(ctx, dispatch.js, assignmentqueue.Bucket{Name: bucket, TTL: time.Hour}, payloadKey)
			if err != nil {
				t.Fatal(err)
			}
			// In batches, each awaited: the client stalls (and fails) when more asynchronous
			// publishes wait for their acks than its limit, which a loaded machine reaches.
			const keys, batch = 12000, 1000
			for i := range keys {
				if _, err := dispatch.js.PublishAsync(fmt.Sprintf("$KV.CI_TASKS.linux-%d", i+1), []byte{1}); err != nil {
					t.Fatal(err)
				}
				if (i+1)%batch != 0 {
					continue
				}
				select {
				case <-dispatch.js.PublishAsyncComplete():
				case <-ctx.Done():
					t.Fatal(ctx.Err())
				}
			}
			if ids, err := dp.IDs(ctx); err != nil || len(ids) != keys {
				t.Fatalf("dispatch: IDs = %d keys, %v; want %d", len(ids), err, keys)
			}
			dispatch.clean(t)
			recoverC := srv.connect(t, "RECOVER")
			rp, err := assignmentqueue.OpenPayloads(ctx, recoverC.js, bucket, payloadKey)
			if err != nil {
				t.Fatal(err)
			}
			if ids, err := rp.IDs(ctx); err != nil || len(ids) != keys {
				t.Fatalf("recover: IDs = %d keys, %v; want %d", len(ids), err, keys)
			}
			recoverC.clean(t)
		})
	}
}

// withNextKeys is the shipped authorization block as a rotation of the NATS users' keys has it
// (docs/OPERATIONS.md, "Rotating secrets", block "rotate nats-credentials add", whose sed makes
// the same text): after each user's line, one giving the key in NKEY_<USER>_NEXT the same
// permissions.
func withNextKeys(conf string) string {
	return regexp.MustCompile(`(?m)^( *)\{nkey: \$NKEY_([A-Z_]+), permissions: \$PERMS_([A-Z_]+)\}$`).
		ReplaceAllString(conf, "$0\n$1{nkey: $$NKEY_${2}_NEXT, permissions: $$PERMS_$3}")
}

// TestNATSRotationNextKey: while a rotation adds each user's next key beside the current one,
// nats-server accepts both, and the next key has exactly its user's permissions: allowed what the
// user may do, refused what it may not.
func TestNATSRotationNextKey(t *testing.T) {
	conf := withNextKeys(readAuthorization(t))
	if got := len(regexp.MustCompile(`(?m)^ *\{nkey: \$NKEY_[A-Z_]+_NEXT, `).FindAllString(conf, -1)); got != len(natsUsers) {
		t.Fatalf("%d next-key lines, want one per user (%d):\n%s", got, len(natsUsers), conf)
	}
	dir := t.TempDir()
	next, nextKeys := map[string]string{}, map[string]string{}
	for _, u := range natsUsers {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		nextKeys["NKEY_"+u+"_NEXT"] = pub
		next[u] = filepath.Join(dir, strings.ToLower(u)+".nk")
		if err := os.WriteFile(next[u], []byte(string(seed)+"\n"+pub+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	srv := startAuthorizedNATSWith(t, conf, "", nextKeys)
	rotated := authorizedNATS{url: srv.url, seeds: next}
	for _, u := range natsUsers {
		srv.connect(t, u) // the current key still connects
		rotated.connect(t, u)
	}
	ctx := flowContext(t)
	dispatch := rotated.connect(t, "DISPATCH")
	if err := signedQueue(dispatch.js).EnsureStream(ctx); err != nil {
		t.Fatalf("dispatch's next key: EnsureStream: %v", err)
	}
	dispatch.clean(t)
	gateway := rotated.connect(t, "GATEWAY")
	gateway.denied(t, "publish an assignment", "ci.assignment.pod", func(ctx context.Context) error {
		_, err := signedQueue(gateway.js).Publish(ctx, testAssignment(t, 1))
		return err
	})
}
