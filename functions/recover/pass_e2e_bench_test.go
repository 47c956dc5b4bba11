//go:build e2e

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kubeenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// passPayloads is how many payloads the recover pass benchmark stores.
const passPayloads = 10_000

// passProfile is the benchmark pool's pod profile: one runner container.
const passProfile = `{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"runner:v1"}]}}}`

// runningTasks is Gitea's side of the pass benchmark: every task still
// runs. It counts the questions (one UpdateTask each in Gitea).
type runningTasks struct{ asked atomic.Int64 }

func (g *runningTasks) Terminal(context.Context, int64) (bool, error) {
	g.asked.Add(1)
	return false, nil
}

func (g *runningTasks) Report(context.Context, int64, executor.Executor) error {
	return fmt.Errorf("no executor ended: nothing to report")
}

// BenchmarkE2ERecoverPass measures one recover pass (recoverer.Run, built
// by recover's own build from its Config: the pod backend from KUBECONFIG
// with GDR_KUBE_QPS / GDR_KUBE_BURST, the payload store, the end marks, the
// signed queue) over passPayloads stored payloads on a real JetStream
// (embedded) and a real kube-apiserver v1.37.2 + etcd, in the two states a
// pass meets them in:
//
//   - queued: every payload's assignment waits in the stream (a backlog)
//     and no executor exists. The pass lists the executors (one LIST), the
//     payload IDs, and then, since none has an executor, the queued
//     assignments (one read per message, each opened and decoded) to tell
//     they are no orphans;
//   - running: every payload has its executor Pod (and its Secret, as
//     handle's Create leaves them), Running (its phase set as a kubelet
//     would), every task still runs in Gitea. The pass lists the Pods
//     (pages of 500), and for each executor Worker.Finish asks Gitea (a
//     counting stand-in here: 1 call per executor, reported as gitea/op and
//     not in the time) and the API server (Find's label-selected LIST,
//     BindIdentity's GET Pod and GET Secret; a Pending Pod costs one GET
//     Secret more, in Find), then lists the payload IDs, all of which have
//     an executor.
//
// Floors, in the same run: floor-keys lists the payload bucket's keys
// (KeyValue.ListKeys) and reads every message of the stream
// (Stream.GetMsg, nothing opened); floor-list lists the Pods as the backend
// does (label selector, pages of 500) with a client without a limit.
// API calls per pass are counted by the API server (calls/op, by verb in
// the log). The sub-benchmarks are named for their state and client limit
// (qps=5 is client-go's default, what recover shipped with; 50 is
// GDR_KUBE_QPS's default; -1 none); a running pass at qps=5 makes 3 calls per
// executor, 30,000 calls at 5 a second, so the command below leaves it out.
//
//	CI=true go test -tags e2e -run '^$' -bench 'E2ERecoverPass/^(queued|floor|running-qps=-1|running-qps=50)' -benchtime 1x -timeout 60m -v ./functions/recover/
func BenchmarkE2ERecoverPass(b *testing.B) {
	plane, err := kubeenv.Start(kubeenv.Assets(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = plane.Stop() })
	admin, ns := plane.Client(b), plane.Namespace(b)
	dir := b.TempDir()
	if err := plane.WriteKubeconfig(filepath.Join(dir, "kubeconfig")); err != nil {
		b.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	ca, err := svidca.LoadOrCreate(filepath.Join(dir, "ca"), td)
	if err != nil {
		b.Fatal(err)
	}
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 20000, profile: "+passProfile+"}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	if err := (gitea.FileStore{Path: filepath.Join(dir, "linux.json")}).Save(gitea.Credentials{ID: 1, UUID: "uuid", Token: "runner-token"}); err != nil {
		b.Fatal(err)
	}
	q := jetstreamenv.NewQueue(b)
	q.OpenConsumer(b, taskassignment.BackendPod, 1000)
	for k, v := range map[string]string{
		"KUBECONFIG": filepath.Join(dir, "kubeconfig"), "GDR_KUBE_NAMESPACE": ns, "GDR_POD_IDENTITY": "ca", "GDR_CA_DIR": filepath.Join(dir, "ca"),
		"GDR_GITEA_URL": "http://127.0.0.1:1/", "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir, "GDR_NATS_URL": q.URL,
		"GDR_TRUST_DOMAIN": td.Name(), "GDR_PAYLOAD_KEY": base64.StdEncoding.EncodeToString(q.Key),
		"GDR_BOOTSTRAP_KEY": base64.StdEncoding.EncodeToString(q.Key), "GDR_GATEWAY_URL": "https://gw.example.org",
		// jetstreamenv's signer: recover opens what the queue holds with it.
		"GDR_ASSIGNMENT_SIGNING_KEY": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{8}, 32)),
	} {
		b.Setenv(k, v)
	}
	base, err := loadConfig()
	if err != nil {
		b.Fatal(err)
	}
	_, keys, err := base.Parse()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	// The payloads and their queued assignments (not timed).
	start := time.Now()
	assignments := make([]taskassignment.Assignment, passPayloads)
	for i := range assignments {
		id := int64(i + 1)
		identity, err := taskidentity.New(td, "alice/demo", "build", id)
		if err != nil {
			b.Fatal(err)
		}
		if assignments[i], err = taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: id, Pool: "linux"}, identity); err != nil {
			b.Fatal(err)
		}
		if err := q.Payloads.Put(ctx, assignments[i].ID, passTask(b, id)); err != nil {
			b.Fatal(err)
		}
		if _, err := q.Queue.Publish(ctx, assignments[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("stored %d payloads and queued their assignments in %s", passPayloads, time.Since(start).Round(time.Millisecond))

	pass := func(b *testing.B, qps float32, burst int, wantExecutors int) {
		cfg := base
		cfg.KubeQPS, cfg.KubeBurst = qps, burst
		r, _, closeFn, err := build(ctx, cfg, log)
		if err != nil {
			b.Fatal(err)
		}
		defer closeFn()
		var tasks runningTasks
		for name, p := range r.Pools {
			r.Pools[name] = recoverer.Pool{Pool: p.Pool, Tasks: &tasks}
		}
		before := requests(b, plane)
		b.ResetTimer()
		for range b.N {
			sum, err := r.Run(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if sum.Executors != wantExecutors || sum.Pending != wantExecutors || sum.Failed != 0 || sum.Republished != 0 || sum.PayloadsDeleted != 0 {
				b.Fatalf("pass %+v, want %d executors, all pending, nothing else", sum, wantExecutors)
			}
		}
		b.StopTimer()
		calls := requests(b, plane).Minus(before)
		b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/pass")
		b.ReportMetric(calls.Only("pods", "secrets", "nodes", "events").Total()/float64(b.N), "calls/op") // the server's own apart
		b.ReportMetric(float64(tasks.asked.Load())/float64(b.N), "gitea/op")
		b.Logf("pass over %d payloads, %d executors: %.2f s; API calls per pass: %s; the API server's own: %s; Gitea questions per pass: %d",
			passPayloads, wantExecutors, b.Elapsed().Seconds()/float64(b.N), calls.Only("pods", "secrets", "nodes", "events").Per(b.N),
			calls.Without("pods", "secrets", "nodes", "events").Per(b.N), tasks.asked.Load()/int64(b.N))
	}
	floorKeys := func(b *testing.B) {
		kv, err := q.JetStream.KeyValue(ctx, q.Payloads.Bucket())
		if err != nil {
			b.Fatal(err)
		}
		stream, err := q.JetStream.Stream(ctx, q.Queue.Stream())
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		var keysTime, msgsTime time.Duration
		for range b.N {
			t0 := time.Now()
			keys, err := kv.ListKeys(ctx)
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for range keys.Keys() {
				n++
			}
			if n != passPayloads {
				b.Fatalf("%d keys, want %d", n, passPayloads)
			}
			t1 := time.Now()
			info, err := stream.Info(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
				if _, err := stream.GetMsg(ctx, seq); err != nil {
					b.Fatal(err)
				}
			}
			if info.State.Msgs != passPayloads {
				b.Fatalf("%d messages, want %d", info.State.Msgs, passPayloads)
			}
			keysTime, msgsTime = keysTime+t1.Sub(t0), msgsTime+time.Since(t1)
		}
		b.StopTimer()
		b.ReportMetric(keysTime.Seconds()/float64(b.N), "s-keys")
		b.ReportMetric(msgsTime.Seconds()/float64(b.N), "s-msgs")
	}

	b.Run("queued-qps=5", func(b *testing.B) { pass(b, 5, 10, 0) })
	b.Run("queued-qps=50", func(b *testing.B) { pass(b, 50, 100, 0) })
	b.Run("floor-keys", floorKeys)

	// Every payload's executor, as handle's Create leaves it: its Pod and
	// its Secret (with the minted SVID), created side by side (not timed).
	start = time.Now()
	seeder, err := pod.New(pod.Config{Client: admin, Namespace: ns, Keys: keys, TrustDomain: td, Minter: ca,
		Pools: runnerpool.Pools{{Name: "linux", Backend: taskassignment.BackendPod, JobTimeout: runnerpool.Duration(time.Hour), Profile: json.RawMessage(passProfile)}}})
	if err != nil {
		b.Fatal(err)
	}
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= passPayloads {
					return
				}
				a := assignments[i]
				e, err := seeder.Create(ctx, a, executor.LaunchSpec{Metadata: keys.Metadata(a), Environment: map[string]string{"GDR_BENCH": "1"}})
				if err == nil {
					err = setRunning(ctx, admin.CoreV1().Pods(ns), e.Name)
				}
				if err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
	b.Logf("created %d executors (Pod and Secret, Running) in %s", passPayloads, time.Since(start).Round(time.Millisecond))

	b.Run("running-qps=-1", func(b *testing.B) { pass(b, -1, 0, passPayloads) })
	b.Run("running-qps=50", func(b *testing.B) { pass(b, 50, 100, passPayloads) })
	b.Run("running-qps=5", func(b *testing.B) { pass(b, 5, 10, passPayloads) })
	b.Run("floor-list", func(b *testing.B) {
		sel := metav1.ListOptions{LabelSelector: labels.SelectorFromValidatedSet(keys.RunnerSelector()).String(), Limit: pod.DefaultPageSize}
		b.ResetTimer()
		for range b.N {
			opts, n := sel, 0
			for {
				list, err := admin.CoreV1().Pods(ns).List(ctx, opts)
				if err != nil {
					b.Fatal(err)
				}
				n += len(list.Items)
				if list.Continue == "" {
					break
				}
				opts.Continue = list.Continue
			}
			if n != passPayloads {
				b.Fatalf("listed %d Pods, want %d", n, passPayloads)
			}
		}
		b.StopTimer()
		b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/list")
	})
}

// setRunning sets the Pod's phase to Running, as its kubelet would.
func setRunning(ctx context.Context, pods typedcorev1.PodInterface, name string) error {
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	p.Status.Phase = corev1.PodRunning
	_, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

// passTask is a payload as dispatch stores it: the task with its workflow,
// context, secrets and variables.
func passTask(b *testing.B, id int64) *runnerv1.Task {
	b.Helper()
	taskCtx, err := structpb.NewStruct(map[string]any{
		"server_url": "http://gitea.example.org/", "repository": "alice/demo", "run_id": "7", "job": "build",
		"gitea_runtime_token": "runtime-token", "event": map[string]any{"ref": "refs/heads/main"},
	})
	if err != nil {
		b.Fatal(err)
	}
	return &runnerv1.Task{
		Id:              id,
		WorkflowPayload: []byte("on: push\njobs:\n  build:\n    runs-on: ubuntu-latest\n    steps:\n      - run: make test\n"),
		Context:         taskCtx,
		Secrets:         map[string]string{"DEPLOY_KEY": "s3cret", "GITEA_TOKEN": "token"},
		Vars:            map[string]string{"REGION": "eu"},
	}
}

// requests are the API server's request counts so far.
func requests(b *testing.B, plane *kubeenv.Plane) kubeenv.Requests {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := plane.Requests(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return r
}
