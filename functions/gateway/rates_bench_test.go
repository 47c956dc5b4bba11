//go:build e2e

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
	"github.com/prometheus/procfs"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gateway"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskworkflow"
)

// BenchmarkE2EGatewayRate measures what one gateway replica forwards: the
// calls a running job's runner makes for its whole run (UpdateLog, one log
// row, then UpdateTask, its state; act_runner and our runner send both every
// few seconds), from c executors at once, each calling back to back for
// GDR_BENCH_WINDOW (default 20 s), for each c of GDR_BENCH_EXECUTORS
// (default 10,50,100), against a real Gitea 1.27.3 (default queue, SQLite).
// Two paths per c, one after the other:
//
//   - floor: every executor calls Gitea straight, with the pool's
//     registration (what an executor holding the runner token would do),
//     each with its own HTTP connection, as a runner has;
//   - gateway: every executor calls the gateway binary (built from this
//     package, run with its defaults, its SVID and bundle from files) over
//     SPIFFE mTLS with its own X.509-SVID and capability, and the gateway
//     forwards to Gitea with the pool's registration.
//
// Each executor owns one real task, claimed from Gitea (a workflow of c jobs)
// and stored sealed in the JetStream KV bucket as dispatch stores it; it
// fetched its task through the gateway once before the windows (the
// binding, not timed). It reports calls/s, p50/p95/p99 per call, and the
// CPU of Gitea and of the gateway over each window (the load generator runs
// in the benchmark process, on the same cores).
//
//	CI=true go test -tags e2e -run '^$' -bench E2EGatewayRate -benchtime 1x -timeout 30m ./functions/gateway/
func BenchmarkE2EGatewayRate(b *testing.B) {
	levels := []int{10, 50, 100}
	if v := os.Getenv("GDR_BENCH_EXECUTORS"); v != "" {
		levels = nil
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("GDR_BENCH_EXECUTORS: %q is not a positive number", f)
			}
			levels = append(levels, n)
		}
	}
	window := 20 * time.Second
	if v := os.Getenv("GDR_BENCH_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("GDR_BENCH_WINDOW: %v", err)
		}
		window = d
	}
	env := newRateEnv(b, slices.Max(levels))
	var report []string
	for _, c := range levels {
		for _, path := range []string{"floor", "gateway"} {
			b.Run(fmt.Sprintf("executors=%d/%s", c, path), func(b *testing.B) {
				w := env.drive(b, c, path == "gateway", window)
				report = append(report, fmt.Sprintf("executors=%d %s: %s", c, path, w))
				b.ReportMetric(w.rate(), "calls/s")
				b.ReportMetric(w.quantile(nil, 0.95), "p95-ms")
			})
		}
	}
	fmt.Println(strings.Join(report, "\n"))
}

// gatewayEnv is a Gitea with claimed tasks, NATS with their payloads, the
// gateway process, and one executor per task.
type gatewayEnv struct {
	gitea     *giteaenv.Server
	giteaPID  int
	gateway   *testenv.Process
	executors []*executor
}

// executor is one task's runner: its client of the gateway, and a client of
// Gitea with the pool's registration (the floor).
type executor struct {
	task   int64
	gw     client
	direct *gitea.Client
	mu     sync.Mutex
	index  int64 // the log rows Gitea has acknowledged
}

// client is the two calls the benchmark makes, as the gateway's client and
// gitea.Client both answer them.
type client interface {
	UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error)
	UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error)
}

// viaGateway adapts the gateway's Connect client to client.
type viaGateway struct {
	rpc runnerv1connect.RunnerServiceClient
}

func (v viaGateway) UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	res, err := v.rpc.UpdateTask(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func (v viaGateway) UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	res, err := v.rpc.UpdateLog(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

const benchTrustDomain = "ci.example.org"

func newRateEnv(b *testing.B, n int) *gatewayEnv {
	b.Helper()
	ctx := context.Background()
	td := spiffeid.RequireTrustDomainFromString(benchTrustDomain)
	dir := b.TempDir()
	bin := filepath.Join(dir, "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}

	g := giteaenv.Start(b, giteaenv.Options{})
	repo := g.CreateRepo(b, "demo")
	creds, err := gitea.Register(ctx, g.URL, nil, gitea.Registration{Token: g.RegistrationToken(b), Name: "rates", Labels: []string{"ubuntu-latest"}})
	if err != nil {
		b.Fatal(err)
	}
	credsFile := filepath.Join(dir, "linux.json")
	if err := (gitea.FileStore{Path: credsFile}).Save(creds); err != nil {
		b.Fatal(err)
	}
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, fmt.Appendf(nil, "pools:\n  - name: linux\n    labels: [ubuntu-latest]\n    backend: process\n    capacity: %d\n    credentials: %s\n", n, credsFile), 0o600); err != nil {
		b.Fatal(err)
	}

	_, natsURL := jetstreamenv.Start(b)
	_, js := jetstreamenv.Connect(b, natsURL)
	payloadKey, bootKey := bytes.Repeat([]byte{3}, 32), bytes.Repeat([]byte{4}, 32)
	payloads, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: "CI_TASKS", TTL: time.Hour}, payloadKey)
	if err != nil {
		b.Fatal(err)
	}

	// n jobs, claimed as dispatch claims them: FetchTask, then the sealed
	// payload under the assignment's ID.
	var jobs strings.Builder
	jobs.WriteString("name: ci\non: [push]\njobs:\n")
	for i := range n {
		fmt.Fprintf(&jobs, "  j%04d:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo %d\n", i, i)
	}
	g.PushWorkflow(b, repo, ".gitea/workflows/ci.yml", jobs.String())
	direct, err := gitea.NewClient(g.URL, nil, creds)
	if err != nil {
		b.Fatal(err)
	}
	var assignments []taskassignment.Assignment
	for deadline := time.Now().Add(5 * time.Minute); len(assignments) < n; {
		task, err := direct.FetchTask(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if task == nil {
			if time.Now().After(deadline) {
				b.Fatalf("%d tasks claimed of %d", len(assignments), n)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		a, err := taskworkflow.FromTask(td, taskassignment.BackendProcess, "linux", task)
		if err != nil {
			b.Fatal(err)
		}
		if err := payloads.Put(ctx, a.ID, task); err != nil {
			b.Fatal(err)
		}
		assignments = append(assignments, a)
	}

	// The gateway, with its SVID and the bundle from files.
	ca, err := svidca.New(td)
	if err != nil {
		b.Fatal(err)
	}
	gatewayID := spiffeid.RequireFromPath(td, "/gateway")
	svid, err := ca.Mint(gatewayID, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	cert, key, err := svid.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	bundle, err := ca.Bundle().Marshal()
	if err != nil {
		b.Fatal(err)
	}
	files := map[string][]byte{"svid.pem": cert, "svid-key.pem": key, "bundle.pem": bundle}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	ports, err := testenv.FreePorts(2)
	if err != nil {
		b.Fatal(err)
	}
	addr, metricsAddr := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"GDR_HTTP_ADDR="+addr, "GDR_METRICS_ADDR="+metricsAddr, "GDR_GITEA_URL="+g.URL, "GDR_POOLS_FILE="+pools,
		"GDR_STATE_DIR="+filepath.Join(dir, "state"), "GDR_NATS_URL="+natsURL, "GDR_TRUST_DOMAIN="+benchTrustDomain,
		"GDR_PAYLOAD_KEY="+b64(payloadKey), "GDR_BOOTSTRAP_KEY="+b64(bootKey),
		"GDR_SVID_CERT="+filepath.Join(dir, "svid.pem"), "GDR_SVID_KEY="+filepath.Join(dir, "svid-key.pem"),
		"GDR_SVID_BUNDLE="+filepath.Join(dir, "bundle.pem"))
	logPath := filepath.Join(dir, "gateway.log")
	logf, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	proc, err := testenv.StartProcess(cmd)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { proc.Stop(5 * time.Second) })
	readyCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := proc.WaitReady(readyCtx, 100*time.Millisecond, func(ctx context.Context) error {
		resp, err := http.Get("http://" + metricsAddr + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/healthz answers %d", resp.StatusCode)
		}
		return nil
	}); err != nil {
		b.Fatalf("gateway: %v\n%s", err, testenv.LogTail(logPath, 30))
	}

	// One executor per task, bound to it through the gateway.
	boot, err := bootstrap.New(bootKey, "https://"+addr, gatewayID)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("gateway log tail:\n%s", testenv.LogTail(logPath, 30))
		}
	})
	env := &gatewayEnv{gitea: g, giteaPID: g.PID(), gateway: proc}
	for _, a := range assignments {
		id := spiffeid.RequireFromString(a.Identity.SPIFFEID)
		svid, err := ca.Mint(id, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		rpc := executorClient("https://"+addr, gateway.Credentials{SVID: svid, Bundle: ca, AssignmentID: a.ID,
			Capability: boot.Capability(a.ID, a.Task.ID, a.Identity.SPIFFEID)}, tlsconfig.AuthorizeID(gatewayID), sourceAddr(len(env.executors)))
		res, err := rpc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
		if err != nil || res.Msg.GetTask().GetId() != a.Task.ID {
			b.Fatalf("executor of task %d: FetchTask through the gateway: %v", a.Task.ID, err)
		}
		// Its own connection to Gitea, as a runner has.
		own, err := gitea.NewClient(g.URL, &http.Client{Timeout: 30 * time.Second, Transport: http.DefaultTransport.(*http.Transport).Clone()}, creds)
		if err != nil {
			b.Fatal(err)
		}
		env.executors = append(env.executors, &executor{task: a.Task.ID, gw: viaGateway{rpc: rpc}, direct: own})
	}
	return env
}

// executorClient is gateway.NewClient (the same TLS configuration, HTTP/2,
// idle connections and headers) dialling from source: every executor Pod
// has an address of its own, and the gateway caps the connections of one
// source address (function.MaxConnectionsPerSource), so executors that all
// dialled from 127.0.0.1 would be refused past that cap.
func executorClient(url string, creds gateway.Credentials, server tlsconfig.Authorizer, source net.IP) runnerv1connect.RunnerServiceClient {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: source}, Timeout: 30 * time.Second}
	hc := &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			DialContext:         dialer.DialContext,
			TLSClientConfig:     tlsconfig.MTLSClientConfig(creds.SVID, creds.Bundle, server),
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     90 * time.Second,
		},
	}
	headers := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set(gateway.HeaderAssignment, creds.AssignmentID)
			req.Header().Set(gateway.HeaderCapability, creds.Capability)
			return next(ctx, req)
		}
	})
	return runnerv1connect.NewRunnerServiceClient(hc, url, connect.WithInterceptors(headers))
}

// sourceAddr is executor i's loopback address: 127.0.1.1, 127.0.1.2, ...
// (Linux answers all of 127.0.0.0/8 on lo).
func sourceAddr(i int) net.IP { return net.IPv4(127, 0, byte(1+(i+1)/256), byte((i+1)%256)) }

func b64(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

// window is what one path did in one window.
type window struct {
	c                    int
	elapsed              time.Duration
	lat                  map[string][]time.Duration // by method
	errs                 int
	timeouts             int // errs that are deadline_exceeded
	firstErr             error
	giteaCPU, gatewayCPU float64 // seconds
	load                 string
}

func (w window) calls() int {
	n := 0
	for _, l := range w.lat {
		n += len(l)
	}
	return n
}

func (w window) rate() float64 { return float64(w.calls()) / w.elapsed.Seconds() }

// quantile is the q-quantile of the latencies of methods (all when nil), in ms.
func (w window) quantile(methods []string, q float64) float64 {
	var all []time.Duration
	for m, l := range w.lat {
		if methods == nil || slices.Contains(methods, m) {
			all = append(all, l...)
		}
	}
	if len(all) == 0 {
		return 0
	}
	slices.Sort(all)
	i := min(int(float64(len(all))*q), len(all)-1)
	return float64(all[i].Microseconds()) / 1000
}

func (w window) String() string {
	s := fmt.Sprintf("%d calls in %.1f s = %.0f calls/s; per call p50 %.1f ms p95 %.1f ms p99 %.1f ms",
		w.calls(), w.elapsed.Seconds(), w.rate(), w.quantile(nil, 0.5), w.quantile(nil, 0.95), w.quantile(nil, 0.99))
	for _, m := range []string{"UpdateLog", "UpdateTask"} {
		s += fmt.Sprintf("; %s %d p50 %.1f p95 %.1f", m, len(w.lat[m]), w.quantile([]string{m}, 0.5), w.quantile([]string{m}, 0.95))
	}
	s += fmt.Sprintf("; errors %d (%d past the 10 s deadline)", w.errs, w.timeouts)
	if w.firstErr != nil {
		s += fmt.Sprintf(" (first: %v)", w.firstErr)
	}
	calls := float64(w.calls())
	s += fmt.Sprintf("; Gitea CPU %.0f %% of a core (%.2f ms/call)", w.giteaCPU*100/w.elapsed.Seconds(), w.giteaCPU*1000/calls)
	if w.gatewayCPU > 0 {
		s += fmt.Sprintf(", gateway CPU %.0f %% of a core (%.2f ms/call)", w.gatewayCPU*100/w.elapsed.Seconds(), w.gatewayCPU*1000/calls)
	}
	return s + "; load " + w.load
}

// callTimeout is each call's deadline: shared/runner/reporter's CallTimeout.
const callTimeout = 10 * time.Second

// drive runs c executors for d, each calling UpdateLog then UpdateTask back
// to back, through the gateway or straight to Gitea.
func (e *gatewayEnv) drive(b *testing.B, c int, viaGW bool, d time.Duration) window {
	b.Helper()
	if c > len(e.executors) {
		b.Fatalf("%d executors, %d tasks", c, len(e.executors))
	}
	giteaCPU0, gwCPU0 := cpuSeconds(b, e.giteaPID), cpuSeconds(b, e.gateway.PID())
	// Each call has the runner reporter's deadline (its CallTimeout, 10 s,
	// sent along as Connect's timeout), not the window's: a call in flight
	// when the window ends runs to its end and is left out.
	stop := time.Now().Add(d)
	over := func() bool { return time.Now().After(stop) }
	// The CPU is read when the window ends, not after the calls in flight.
	var giteaCPU1, gwCPU1 float64
	read := make(chan struct{})
	time.AfterFunc(d, func() {
		giteaCPU1, gwCPU1 = cpuSeconds(b, e.giteaPID), cpuSeconds(b, e.gateway.PID())
		close(read)
	})
	var (
		mu sync.Mutex
		w  = window{c: c, lat: map[string][]time.Duration{}}
		wg sync.WaitGroup
	)
	start := time.Now()
	for _, ex := range e.executors[:c] {
		var cl client = ex.direct
		if viaGW {
			cl = ex.gw
		}
		wg.Go(func() {
			lat := map[string][]time.Duration{}
			var errs, timeouts int
			var firstErr error
			note := func(m string, t0 time.Time, err error) {
				if over() {
					return // ended after the window
				}
				if err != nil {
					errs++
					if connect.CodeOf(err) == connect.CodeDeadlineExceeded {
						timeouts++
					}
					if firstErr == nil {
						firstErr = fmt.Errorf("task %d %s: %w", ex.task, m, err)
					}
					return
				}
				lat[m] = append(lat[m], time.Since(t0))
			}
			for !over() {
				ex.mu.Lock()
				idx := ex.index
				ex.mu.Unlock()
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				res, err := cl.UpdateLog(ctx, &runnerv1.UpdateLogRequest{TaskId: ex.task, Index: idx, Rows: []*runnerv1.LogRow{
					{Time: timestamppb.Now(), Content: fmt.Sprintf("step output line %d of task %d: the quick brown fox jumps over the lazy dog", idx, ex.task)}}})
				note("UpdateLog", t0, err)
				if err == nil {
					ex.mu.Lock()
					ex.index = res.GetAckIndex()
					ex.mu.Unlock()
				}
				cancel()
				if over() {
					break
				}
				t0 = time.Now()
				ctx, cancel = context.WithTimeout(context.Background(), callTimeout)
				_, err = cl.UpdateTask(ctx, &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: ex.task}})
				cancel()
				note("UpdateTask", t0, err)
			}
			mu.Lock()
			defer mu.Unlock()
			for m, l := range lat {
				w.lat[m] = append(w.lat[m], l...)
			}
			w.errs += errs
			w.timeouts += timeouts
			if w.firstErr == nil {
				w.firstErr = firstErr
			}
		})
	}
	wg.Wait()
	w.elapsed = stop.Sub(start)
	<-read
	w.giteaCPU = giteaCPU1 - giteaCPU0
	if viaGW {
		w.gatewayCPU = gwCPU1 - gwCPU0
	}
	w.load = loadavg()
	// A call past its deadline is a measurement (Gitea too slow at this
	// load: a runner retries it); any other failure is a fault.
	if w.errs > w.timeouts {
		b.Errorf("%d of %d calls failed, %d past their deadline; first: %v", w.errs, w.calls()+w.errs, w.timeouts, w.firstErr)
	}
	return w
}

// cpuSeconds is the CPU time (user + system) process pid has used.
func cpuSeconds(b *testing.B, pid int) float64 {
	b.Helper()
	p, err := procfs.NewProc(pid)
	if err != nil {
		b.Fatal(err)
	}
	st, err := p.Stat()
	if err != nil {
		b.Fatal(err)
	}
	return st.CPUTime()
}

func loadavg() string {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return "?"
	}
	l, err := fs.LoadAvg()
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%.2f %.2f %.2f", l.Load1, l.Load5, l.Load15)
}
