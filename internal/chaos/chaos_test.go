package chaos

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	mathrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/natscluster"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// settings size a run; env overrides each (make chaos: 1000 tasks, 200
// kills, 6 NATS server kills). The defaults are the short variant that runs in
// `go test ./...`.
type settings struct {
	Tasks, Kills, NATSKills int
	// Rate is how many jobs Gitea queues per second.
	Rate float64
	// Handles is the most handle runs at once (KEDA's maxReplicaCount).
	Handles int
	// Drain bounds the wait, after the last job is queued and the last
	// kill, for every task to end and everything to be cleaned up.
	Drain time.Duration
	Seed  uint64
	// Logs, if set, is where the processes' logs go (kept after the run).
	Logs string
}

func loadSettings(t *testing.T) settings {
	s := settings{Tasks: 60, Kills: 15, NATSKills: 3, Rate: 4, Handles: 4, Drain: 90 * time.Second,
		Seed: uint64(time.Now().UnixNano())}
	ints := map[string]*int{"CHAOS_TASKS": &s.Tasks, "CHAOS_KILLS": &s.Kills, "CHAOS_NATS_KILLS": &s.NATSKills, "CHAOS_HANDLES": &s.Handles}
	for k, p := range ints {
		if v := os.Getenv(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a count", k, v)
			}
			*p = n
		}
	}
	if v := os.Getenv("CHAOS_RATE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			t.Fatalf("CHAOS_RATE=%q: want jobs per second", v)
		}
		s.Rate = f
	}
	if v := os.Getenv("CHAOS_DRAIN"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CHAOS_DRAIN=%q: %v", v, err)
		}
		s.Drain = d
	}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		s.Seed = n
	}
	s.Logs = os.Getenv("CHAOS_LOGS")
	return s
}

// Timings of the run, scaled down from production's by about 20: Gitea's
// ZOMBIE_TASK_TIMEOUT 10m -> 30s, dispatch's keep-alive 1m -> 3s, the
// consumer's AckWait 5m -> 15s (the ratio zombie timeout / AckWait is kept).
const (
	zombieTimeout = 30 * time.Second
	keepAlive     = 3 * time.Second
	ackWait       = 15 * time.Second
	faultRate     = 0.10
	trustDomain   = "ci.example.org"
	osbAPIKey     = "chaos-opensandbox-key"
)

// poolsYAML are the runner pools: both on the OpenSandbox backend, so both
// share its one consumer.
const poolsYAML = `pools:
  - name: linux
    labels: [ubuntu-latest]
    backend: opensandbox
    capacity: 30
    profile: {image: "registry.example.org/runner:1", entrypoint: ["/runner"], resourceLimits: {cpu: "2", memory: "4Gi"}}
  - name: arm
    labels: [ubuntu-latest-arm]
    backend: opensandbox
    capacity: 20
    profile: {image: "registry.example.org/runner-arm:1", entrypoint: ["/runner"], resourceLimits: {cpu: "2", memory: "4Gi"}}
`

const totalCapacity = 50

// TestChaos is the chaos run (see the package doc). It fails, never skips,
// when it cannot build or start its peers.
func TestChaos(t *testing.T) {
	st := loadSettings(t)
	t.Logf("chaos: %d tasks at %.1f/s, %d kills, %d NATS server kills on a 3-node cluster, seed %d (CHAOS_SEED)", st.Tasks, st.Rate, st.Kills, st.NATSKills, st.Seed)
	started := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rng := mathrand.New(mathrand.NewPCG(st.Seed, 1))
	dir := t.TempDir()
	logs := st.Logs
	if logs == "" {
		logs = filepath.Join(dir, "logs")
	}
	for _, d := range []string{logs, filepath.Join(dir, "bin"), filepath.Join(dir, "nats"), filepath.Join(dir, "state")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}

	bins, err := Build(ctx, filepath.Join(dir, "bin"))
	if err != nil {
		t.Fatalf("build the binaries: %v", err)
	}
	t.Logf("built in %s", time.Since(started).Round(time.Millisecond))

	gitea, err := StartGitea(ctx, GiteaOptions{ZombieTimeout: zombieTimeout, FaultRate: faultRate, Seed: st.Seed})
	if err != nil {
		t.Fatal(err)
	}
	defer gitea.Stop()
	osb := sandboxapitest.New(t, sandboxapitest.WithAPIKey(osbAPIKey))

	// NATS: three servers clustered on 127.0.0.1, every stream and bucket
	// R3 (GDR_NATS_REPLICAS below).
	cl := natscluster.New(bins.NATS, filepath.Join(dir, "nats"), 3, natscluster.WithLogDir(logs))
	defer cl.Close()
	if err := cl.Start(ctx); err != nil {
		t.Fatalf("start the NATS cluster: %v", err)
	}

	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte(poolsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	signingSeed := secretkey.Key(bytes.Repeat([]byte{8}, 32))
	signer, err := assignmentsig.NewSigner(signingSeed)
	if err != nil {
		t.Fatal(err)
	}
	payloadKey := secretkey.Key(bytes.Repeat([]byte{7}, 32))
	b64 := base64.StdEncoding.EncodeToString
	// The executors' SVIDs: handle mints one per sandbox from the local CA
	// (GDR_CA_DIR), which the gateway trusts; the gateway's own is minted
	// from it here.
	td := spiffeid.RequireTrustDomainFromString(trustDomain)
	caDir := filepath.Join(dir, "ca")
	gatewaySVID, err := gatewayIdentity(caDir, td, dir)
	if err != nil {
		t.Fatal(err)
	}
	gatewayAddr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
		"GDR_LOG_LEVEL=info", "GDR_NATS_URL=" + cl.URLs(), "GDR_NATS_REPLICAS=3", "GDR_TRUST_DOMAIN=" + trustDomain,
		"GDR_POOLS_FILE=" + pools, "GDR_STATE_DIR=" + filepath.Join(dir, "state"), "GDR_GITEA_URL=" + gitea.URL,
		"GDR_PAYLOAD_KEY=" + b64(payloadKey), "GDR_ASSIGNMENT_SIGNING_KEY=" + b64(signingSeed),
		"GDR_ASSIGNMENT_VERIFY_KEYS=" + b64(signer.Public()),
		"GDR_BOOTSTRAP_KEY=" + b64(bytes.Repeat([]byte{9}, 32)), "GDR_GATEWAY_URL=https://" + gatewayAddr, "GDR_CA_DIR=" + caDir,
		"GDR_OPENSANDBOX_URL=" + osb.URL, "GDR_OPENSANDBOX_API_KEY=" + osbAPIKey,
	}
	dispatchEnv := []string{"GDR_POLL_INTERVAL=250ms", "GDR_KEEPALIVE=" + keepAlive.String(), "GDR_ALLOW_UNSIGNED_WEBHOOKS=true",
		"GDR_HTTP_ADDR=127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))}
	handleEnv := []string{"GDR_MODE=job", "GDR_BACKEND=opensandbox", "GDR_BATCH=1", "GDR_FETCH_WAIT=1s",
		"GDR_NAK_DELAY=250ms", "GDR_ERROR_DELAY=500ms", "GDR_HOLD_FOR=10s", "GDR_MAX_IN_FLIGHT=" + strconv.Itoa(totalCapacity)}
	recoverEnv := []string{"GDR_RECOVER_MODE=once"}
	gatewayEnv := append([]string{"GDR_HTTP_ADDR=" + gatewayAddr}, gatewaySVID...)

	// Set-up, unkilled and without faults: register the pools, create the
	// stream and consumer (handle's setup mode) and the payload bucket
	// (dispatch's first round, with nothing queued yet).
	setup := NewFleet(env, logs, st.Seed)
	setup.SetEndpoints(giteaEndpoints(gitea))
	for _, step := range []struct {
		name, bin string
		extra     []string
		args      []string
	}{
		{"dispatch register", bins.Dispatch, []string{"GDR_REGISTRATION_TOKEN=" + gitea.RegistrationToken}, []string{"register"}},
		{"handle setup", bins.Handle, []string{"GDR_MODE=setup", "GDR_BACKEND=opensandbox", "GDR_MAX_IN_FLIGHT=" + strconv.Itoa(totalCapacity)}, nil},
		{"dispatch run", bins.Dispatch, dispatchEnv, []string{"run"}},
	} {
		if err := setup.Run("setup", step.bin, step.extra, step.args...); err != nil {
			t.Fatalf("%s: %v\n%s", step.name, err, testenv.LogTail(filepath.Join(logs, "setup.log"), 20))
		}
	}

	nc, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	consumer := scaleAckWait(ctx, t, js)
	keys, err := taskassignment.NewKeys("gitea-dynamic-runner.io")
	if err != nil {
		t.Fatal(err)
	}

	// The run: faults on, executors simulated, the functions run as a
	// cluster runs them, jobs queued over time, kills of functions and of
	// NATS servers.
	gitea.SetFaults(true)
	osb.SetFaults(osbFaults(st.Seed))
	execs := &Executors{Sandboxes: osb, TrustDomain: td, Keys: keys,
		Unreported: 0.1, MinRun: 200 * time.Millisecond, MaxRun: 3 * time.Second}
	runCtx, stopRun := context.WithCancel(ctx)
	execCtx, stopExecs := context.WithCancel(ctx)
	execsDone := make(chan struct{})
	go func() {
		defer close(execsDone)
		execs.Run(execCtx, st.Seed)
	}()
	var wg sync.WaitGroup
	fleet := NewFleet(env, logs, st.Seed)
	fleet.SetEndpoints(giteaEndpoints(gitea)) // which process made each call (the verdict's cut claims)
	// A test that stops early leaves no process.
	t.Cleanup(func() { fleet.Close(time.Second) })
	// dispatch and the gateway are Deployments: restarted whenever they
	// exit.
	for _, d := range []struct {
		kind, bin string
		env, args []string
	}{{"dispatch", bins.Dispatch, dispatchEnv, []string{"serve"}}, {"gateway", bins.Gateway, gatewayEnv, nil}} {
		wg.Go(func() {
			for runCtx.Err() == nil {
				if errors.Is(fleet.Run(d.kind, d.bin, d.env, d.args...), ErrClosed) {
					return
				}
				sleep(runCtx, 200*time.Millisecond)
			}
		})
	}
	wg.Go(func() { // a CronJob with concurrencyPolicy Forbid
		r := mathrand.New(mathrand.NewPCG(st.Seed, 2))
		for runCtx.Err() == nil {
			if errors.Is(fleet.Run("recover", bins.Recover, recoverEnv), ErrClosed) {
				return
			}
			sleep(runCtx, time.Second+time.Duration(r.Int64N(int64(time.Second))))
		}
	})
	wg.Go(func() { keda(runCtx, fleet, consumer, st.Handles, bins.Handle, handleEnv) })

	queueFor := time.Duration(float64(st.Tasks) / st.Rate * float64(time.Second))
	queued := make(chan struct{})
	go func() {
		defer close(queued)
		tick := time.NewTicker(time.Duration(float64(time.Second) / st.Rate))
		defer tick.Stop()
		for i := range st.Tasks {
			<-tick.C
			labels, repo := []string{"ubuntu-latest"}, fmt.Sprintf("org%d/repo%d", rng.IntN(5), rng.IntN(20))
			if i%10 >= 7 {
				labels = []string{"ubuntu-latest-arm"}
			}
			gitea.Queue(repo, fmt.Sprintf("job%d", i%7), labels)
		}
	}()
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		kill(runCtx, fleet, st.Kills, queueFor, st.Seed)
	}()
	serverKills := make(chan natsKills, 1)
	go func() {
		serverKills <- killServers(runCtx, t, cl, st.NATSKills, queueFor, st.Seed)
	}()

	<-queued
	<-killed
	nk := <-serverKills
	if nk.err != nil {
		t.Errorf("NATS server kills: %v", nk.err)
	}
	kills, _ := fleet.Kills()
	t.Logf("all %d jobs queued and %d kills done after %s; draining (at most %s)", st.Tasks, kills, time.Since(started).Round(time.Second), st.Drain)
	drained := waitDrained(ctx, st.Drain, func() (bool, string) {
		return drainState(ctx, gitea, osb, js, st.Tasks)
	})
	t.Logf("drain: %s after %s", drained, time.Since(started).Round(time.Second))
	stopRun()
	fleet.Close(10 * time.Second)
	wg.Wait()
	stopExecs()
	<-execsDone

	// One final recover pass, against a Gitea and a backend without faults.
	gitea.SetFaults(false)
	osb.SetFaults(nil)
	final := NewFleet(env, logs, st.Seed)
	final.SetEndpoints(giteaEndpoints(gitea))
	if err := final.Run("recover-final", bins.Recover, recoverEnv); err != nil {
		t.Errorf("final recover pass: %v\n%s", err, testenv.LogTail(filepath.Join(logs, "recover-final.log"), 20))
	}
	cancel()

	// The verdict, from what Gitea, the backend, the executors and the
	// fleet recorded (verdict.go).
	kvStream, err := js.Stream(context.Background(), "KV_"+assignmentqueue.DefaultPayloadBucket)
	if err != nil {
		t.Fatal(err)
	}
	calls := gitea.CallLog()
	evidence := ClaimEvidence{Dispatches: fleet.Lives("dispatch"), Calls: calls, Written: func(id string) bool {
		_, err := kvStream.GetLastMsgForSubject(context.Background(), "$KV."+assignmentqueue.DefaultPayloadBucket+"."+id)
		return !errors.Is(err, jetstream.ErrMsgNotFound)
	}}
	records := gitea.Records()
	tally := judge(records, st.Tasks, execs.Records(), func(r TaskRecord) (bool, string) { return cutClaim(r, evidence) },
		payloadGone(t, kvStream))
	lost, cut, wrong, lines := tally.Lost, tally.Cut, tally.WronglyFailed, tally.Lines
	dups, dupLines := duplicated(osb.Created(), keys)
	leaked, leakLines := leaks(context.Background(), osb, js)
	kills, byKind := fleet.Kills()
	ncalls, faulted := gitea.Calls()
	es, er, eu, en := execs.Counts()
	attributed := 0
	for _, c := range calls {
		if c.Endpoint != "" {
			attributed++
		}
	}
	t.Logf("processes started: %v; killed: %v; NATS servers SIGKILLed: %d (leaders: %v; %d during a leader election)", fleet.Starts(), byKind, nk.kills, nk.leaders, nk.duringElection)
	t.Logf("gitea: %d calls, %d faulted, %d of %d recorded came to a process's own endpoint; claims answered to %s; opensandbox: %d sandboxes created, %d create calls",
		ncalls, faulted, attributed, len(calls), claimants(records, evidence.Dispatches), len(osb.Created()), osb.Calls("POST", "/sandboxes"))
	t.Logf("executors: %d started, %d reported, %d ended without reporting, %d ended without their task; results: %s",
		es, er, eu, en, results(gitea.Records(), fleet.KindOf))
	shareOK, share := ownShare(tally.OwnReports, st.Tasks)
	t.Log(share)
	t.Logf("streams after the final pass (only %s counts as leaked): %s", assignmentqueue.DefaultStream, streams(context.Background(), js))
	t.Logf("wall time %s", time.Since(started).Round(time.Second))
	for _, l := range slices.Concat(lines, dupLines, leakLines) {
		t.Log(l)
	}
	if lost+dups+leaked+wrong > 0 {
		for _, kind := range []string{"dispatch", "handle", "recover", "recover-final"} {
			t.Logf("last lines of %s.log:\n%s", kind, testenv.LogTail(filepath.Join(logs, kind+".log"), 15))
		}
	}
	// Printed apart, never hidden: tasks Gitea handed to a dispatch SIGKILLed
	// before its first write (see cutClaim). Gitea's runner protocol cannot
	// hand a claimed task out again, so no runner recovers these (act_runner
	// neither); Gitea fails them as zombies.
	t.Logf("claims cut by a SIGKILL before dispatch's first write (Gitea fails them as zombies; not counted as lost): %d", cut)
	verdict := fmt.Sprintf("chaos: %d tasks, %d kills, %d lost, %d duplicated, %d leaked, %d wrongly-failed", st.Tasks, kills, lost, dups, leaked, wrong)
	if testing.Verbose() {
		fmt.Println(verdict) // streamed: verbatim, the last line before the test's result
	} else {
		t.Log(verdict) // buffered: the last line of the test's report
	}
	if nk.kills < st.NATSKills || (st.NATSKills >= 2 && nk.duringElection == 0) {
		t.Errorf("NATS faults: %d server kills (want %d), %d during a leader election (want 1)", nk.kills, st.NATSKills, nk.duringElection)
	}
	if !shareOK {
		t.Errorf("too few tasks ended by their executor's own report: %s", share)
	}
	if lost+dups+leaked+wrong > 0 || kills < st.Kills {
		t.Fail()
	}
}

// payloadGone reads from the payload bucket's stream since when each
// payload is gone (PayloadGone): a payload key's last message is its delete
// or purge marker once it is removed (markers are kept for the bucket's TTL,
// far longer than a run).
func payloadGone(t *testing.T, kvStream jetstream.Stream) PayloadGone {
	return func(id string) (time.Time, bool) {
		m, err := kvStream.GetLastMsgForSubject(context.Background(), "$KV."+assignmentqueue.DefaultPayloadBucket+"."+id)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return time.Time{}, true // never written
		}
		if err != nil {
			t.Errorf("the payload bucket's record of %s: %v", id, err)
			return time.Time{}, false // unknown: no excuse
		}
		switch m.Header.Get("KV-Operation") { // the header jetstream's KV writes on a marker
		case "DEL", "PURGE":
			return m.Time, true
		}
		return time.Time{}, false
	}
}

// giteaEndpoints gives each process that calls Gitea (all but handle) its
// own endpoint of g, as its GDR_GITEA_URL (Fleet.SetEndpoints), so that
// every call is known by the process that made it (Gitea.Endpoint).
func giteaEndpoints(g *Gitea) func(kind string) ([]string, string, error) {
	return func(kind string) ([]string, string, error) {
		if kind == "handle" { // never calls Gitea; would its call come, it comes to g.URL, unattributed
			return nil, "", nil
		}
		url, err := g.Endpoint()
		if err != nil {
			return nil, "", err
		}
		return []string{"GDR_GITEA_URL=" + url}, url, nil
	}
}

// scaleAckWait sets the consumer handle's setup mode created to the run's
// AckWait, keeping everything else, and returns it.
func scaleAckWait(ctx context.Context, t *testing.T, js jetstream.JetStream) jetstream.Consumer {
	t.Helper()
	c, err := js.Consumer(ctx, assignmentqueue.DefaultStream, string(taskassignment.BackendOpenSandbox))
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	cfg.AckWait = ackWait
	c, err = js.UpdateConsumer(ctx, assignmentqueue.DefaultStream, cfg)
	if err != nil {
		t.Fatalf("scale the consumer's AckWait: %v", err)
	}
	return c
}

// osbFaults fails a tenth of the backend's calls: 5xx or 429 before the call
// takes effect, 5xx after it (the answer lost), or no answer at all, before
// or after.
func osbFaults(seed uint64) func(method, path string) *sandboxapitest.Fault {
	var mu sync.Mutex
	r := mathrand.New(mathrand.NewPCG(seed, 3))
	statuses := []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable}
	return func(string, string) *sandboxapitest.Fault {
		mu.Lock()
		defer mu.Unlock()
		if r.Float64() >= faultRate {
			return nil
		}
		switch p := r.Float64(); {
		case p < 0.4:
			return &sandboxapitest.Fault{Status: statuses[r.IntN(len(statuses))]}
		case p < 0.55:
			return &sandboxapitest.Fault{Status: http.StatusTooManyRequests, RetryAfter: 1}
		case p < 0.8:
			return &sandboxapitest.Fault{Status: statuses[r.IntN(len(statuses))], AfterEffect: true}
		case p < 0.9:
			return &sandboxapitest.Fault{Drop: true}
		default:
			return &sandboxapitest.Fault{Drop: true, AfterEffect: true}
		}
	}
}

// keda starts handle runs as KEDA's ScaledJob does: while the consumer has
// pending plus ack-pending messages (the lag), it keeps min(lag, max) runs
// going; each run exits by itself.
func keda(ctx context.Context, fleet *Fleet, c jetstream.Consumer, maxRuns int, bin string, env []string) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for sleep(ctx, 250*time.Millisecond) {
		ictx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := c.Info(ictx)
		cancel()
		if err != nil {
			continue // NATS restarting: KEDA sees no lag either
		}
		lag := int(info.NumPending) + info.NumAckPending
		for range min(lag, maxRuns) - fleet.Running("handle") {
			wg.Go(func() { _ = fleet.Run("handle", bin, env) })
		}
	}
}

// kill SIGKILLs function processes until it has killed n of them, about
// evenly over span: mostly a random live one, sometimes (one in five) the
// next one to start, within 300 ms of its start.
func kill(ctx context.Context, fleet *Fleet, n int, span time.Duration, seed uint64) {
	if n == 0 {
		return
	}
	r := mathrand.New(mathrand.NewPCG(seed, 4))
	every := max(span/time.Duration(n), 50*time.Millisecond)
	for {
		if k, _ := fleet.Kills(); k >= n {
			return
		}
		if !sleep(ctx, every/2+time.Duration(r.Int64N(int64(every)))) {
			return
		}
		if r.IntN(5) == 0 {
			fleet.KillNextStart()
			continue
		}
		fleet.KillRandom()
	}
}

// natsKills is what killServers did.
type natsKills struct {
	kills          int
	leaders        map[string]int // the leaders killed, by what they led
	duringElection int
	err            error
}

// leaderTargets are what killServers kills the leader of, in turn: the
// JetStream meta leader, then the leaders of the queue stream and of both
// buckets.
var leaderTargets = []string{"meta", assignmentqueue.DefaultStream, "KV_" + assignmentqueue.DefaultPayloadBucket,
	"KV_" + assignmentqueue.EndingsBucket(assignmentqueue.DefaultPayloadBucket)}

// killServers SIGKILLs n NATS servers, evenly over span, each the current
// leader of the next of leaderTargets, and restarts it with its store after
// a second or two. The second kill lands while a leader election is under
// way: right after the leader dies, while no server names itself leader
// (checked), another server is killed too, and both are restarted.
func killServers(ctx context.Context, t *testing.T, cl *natscluster.Cluster, n int, span time.Duration, seed uint64) natsKills {
	r := mathrand.New(mathrand.NewPCG(seed, 5))
	out := natsKills{leaders: map[string]int{}}
	leaderOf := func(target string) (int, error) {
		if target == "meta" {
			return cl.MetaLeader(ctx)
		}
		return cl.StreamLeader(ctx, target)
	}
	for i := 0; out.kills < n; i++ {
		if !sleep(ctx, span/time.Duration(n+1)) {
			return out
		}
		target := leaderTargets[i%len(leaderTargets)]
		victim, err := leaderOf(target)
		if err != nil { // an election under way: any server will do
			victim, target = r.IntN(cl.Len()), "none"
		}
		if err := cl.Kill(victim); err != nil {
			out.err = err
			return out
		}
		out.kills++
		out.leaders[target]++
		t.Logf("NATS kill %d: %s (leader of %s) SIGKILLed at %s", out.kills, cl.Name(victim), target, time.Now().Format("15:04:05.000"))
		down := []int{victim}
		if i == 1 && out.kills < n {
			if _, err := leaderOf(target); errors.Is(err, natscluster.ErrNoLeader) {
				second := (victim + 1 + r.IntN(cl.Len()-1)) % cl.Len()
				if err := cl.Kill(second); err != nil {
					out.err = err
					return out
				}
				out.kills++
				out.duringElection++
				down = append(down, second)
				t.Logf("NATS kill %d: %s SIGKILLed during the election of a leader of %s, at %s", out.kills, cl.Name(second), target, time.Now().Format("15:04:05.000"))
			}
		}
		sleep(ctx, time.Second+time.Duration(r.Int64N(int64(time.Second))))
		for _, d := range down {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			err := cl.Restart(rctx, d)
			cancel()
			if err != nil {
				out.err = err
				return out
			}
		}
	}
	return out
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// waitDrained polls drained every half second until it says done or limit
// passes, and returns its last word.
func waitDrained(ctx context.Context, limit time.Duration, drained func() (bool, string)) string {
	deadline := time.Now().Add(limit)
	for {
		done, state := drained()
		if done {
			return "drained (" + state + ")"
		}
		if time.Now().After(deadline) || !sleep(ctx, 500*time.Millisecond) {
			return "not drained (" + state + ")"
		}
	}
}

func drainState(ctx context.Context, g *Gitea, osb *sandboxapitest.Server, js jetstream.JetStream, n int) (bool, string) {
	done := g.Done()
	sandboxes := len(osb.Sandboxes())
	keys, msgs, err := queueLeft(ctx, js)
	state := fmt.Sprintf("%d/%d tasks done, %d sandboxes, %d payload keys, %d messages", done, n, sandboxes, len(keys), msgs)
	if err != nil {
		return false, state + ": " + err.Error()
	}
	return done == n && sandboxes == 0 && len(keys) == 0 && msgs == 0, state
}

// queueLeft returns the keys left in the payload bucket (payloads, started
// and sent marks; the end marks recover leaves, kept by design for their
// bucket's TTL so that a late redelivery creates nothing, live in a bucket
// of their own and are no leak) and the number of messages left in the
// stream.
func queueLeft(ctx context.Context, js jetstream.JetStream) ([]string, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, assignmentqueue.DefaultPayloadBucket)
	if err != nil {
		return nil, 0, err
	}
	keys, err := kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, 0, err
	}
	s, err := js.Stream(ctx, assignmentqueue.DefaultStream)
	if err != nil {
		return keys, 0, err
	}
	return keys, s.CachedInfo().State.Msgs, nil
}

// duplicated counts the assignments whose executor was created more than
// once (the fake records every creation, deleted sandboxes included).
func duplicated(created []sandboxapitest.Sandbox, keys taskassignment.Keys) (int, []string) {
	by := map[string][]string{}
	for _, sb := range created {
		a := sb.Metadata[keys.AssignmentID]
		by[a] = append(by[a], sb.ID+"@"+sb.CreatedAt.Format("15:04:05.000"))
	}
	var lines []string
	for _, a := range slices.Sorted(maps.Keys(by)) {
		if len(by[a]) > 1 {
			lines = append(lines, fmt.Sprintf("DUPLICATED: assignment %s: %d sandboxes created: %v", a, len(by[a]), by[a]))
		}
	}
	return len(lines), lines
}

// leaks counts what is left: sandboxes, keys in the payload bucket, messages
// in the stream.
func leaks(ctx context.Context, osb *sandboxapitest.Server, js jetstream.JetStream) (int, []string) {
	var lines []string
	for _, sb := range osb.Sandboxes() {
		lines = append(lines, fmt.Sprintf("LEAKED: sandbox %s (%s) of assignment %s", sb.ID, sb.State, sb.Metadata["gitea-dynamic-runner.io/assignment-id"]))
	}
	keys, msgs, err := queueLeft(ctx, js)
	if err != nil {
		lines = append(lines, fmt.Sprintf("LEAKED: the queue cannot be read: %v", err))
		return len(lines), lines
	}
	for _, k := range keys {
		lines = append(lines, "LEAKED: payload bucket key "+k)
	}
	if msgs > 0 {
		lines = append(lines, fmt.Sprintf("LEAKED: %d messages in the stream", msgs))
	}
	return len(osb.Sandboxes()) + len(keys) + int(msgs), lines
}

// results sums the final results, by result and by the kind of process
// that sent it (kindOf the endpoint it came to; "" if not of the fleet).
func results(records []TaskRecord, kindOf func(endpoint string) string) string {
	count := map[string]int{}
	for _, r := range records {
		for _, f := range r.Finals {
			if !f.Accepted {
				continue
			}
			by := f.By
			if f.By == "protocol" {
				switch kindOf(f.Endpoint) {
				case "gateway":
					by = "executor via gateway"
				case "dispatch":
					by = "dispatch-finalize"
				case "recover", "recover-final":
					by = "recover-report"
				default:
					by = "unknown process"
				}
			}
			count[strings.TrimPrefix(f.Result.String(), "RESULT_")+" by "+by]++
		}
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, count[k]))
	}
	return strings.Join(parts, ", ")
}

// streams lists every stream with the messages it holds, for the record.
func streams(ctx context.Context, js jetstream.JetStream) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var parts []string
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			parts = append(parts, name+"=?")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=%d", name, s.CachedInfo().State.Msgs))
	}
	if err := names.Err(); err != nil {
		parts = append(parts, "error: "+err.Error())
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// gatewayIdentity creates the local CA in caDir (the one handle's
// GDR_CA_DIR loads to mint the sandboxes' SVIDs), mints the gateway's SVID
// from it into files under dir, and returns the gateway's variables that
// name them.
func gatewayIdentity(caDir string, td spiffeid.TrustDomain, dir string) ([]string, error) {
	ca, err := svidca.LoadOrCreate(caDir, td)
	if err != nil {
		return nil, err
	}
	svid, err := ca.Mint(spiffeid.RequireFromPath(td, bootstrap.DefaultGatewayPath), 24*time.Hour)
	if err != nil {
		return nil, err
	}
	cert, key, err := svid.Marshal()
	if err != nil {
		return nil, err
	}
	bundle, err := ca.Bundle().Marshal()
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{"gateway.crt": cert, "gateway.key": key, "bundle.crt": bundle}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return []string{"GDR_SVID_CERT=" + filepath.Join(dir, "gateway.crt"), "GDR_SVID_KEY=" + filepath.Join(dir, "gateway.key"),
		"GDR_SVID_BUNDLE=" + filepath.Join(dir, "bundle.crt")}, nil
}
