//go:build e2e

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kubeenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// `recover status` against the real API server and NATS, with recover's own
// configuration: a task whose Pod the scheduler cannot place shows its run
// URL, its Pod pending and the scheduler's reason; a task with no Pod yet
// shows what the queue holds; `-o json` parses.
func TestE2EStatusShowsWhyATaskWaits(t *testing.T) {
	plane, err := kubeenv.Start(kubeenv.Assets(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plane.Stop() })
	client, ns := plane.Client(t), plane.Namespace(t)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	rc := plane.RESTConfig()
	if err := clientcmd.WriteToFile(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"test": {Server: rc.Host, CertificateAuthorityData: rc.CAData, InsecureSkipTLSVerify: rc.Insecure}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"test": {Token: rc.BearerToken, ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData}},
		Contexts:       map[string]*clientcmdapi.Context{"test": {Cluster: "test", AuthInfo: "test"}},
		CurrentContext: "test",
	}, kubeconfig); err != nil {
		t.Fatal(err)
	}
	const profile = `{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"runner:v1"}]}}}`
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 2, profile: "+profile+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The pool's registration, as `dispatch register` leaves it (status never calls Gitea).
	if err := (gitea.FileStore{Path: filepath.Join(dir, "linux.json")}).Save(gitea.Credentials{ID: 1, UUID: "uuid", Token: "runner-token"}); err != nil {
		t.Fatal(err)
	}
	q := jetstreamenv.NewQueue(t)
	q.OpenConsumer(t, taskassignment.BackendPod, 2)
	key := base64.StdEncoding.EncodeToString([]byte(q.Key))
	for k, v := range map[string]string{
		"KUBECONFIG": kubeconfig, "GDR_KUBE_NAMESPACE": ns, "GDR_CLUSTER_NAME": "test-cluster",
		"GDR_SPIRE_SERVER": "unix:" + filepath.Join(dir, "no-spire.sock"), // recover status never calls SPIRE
		"GDR_GITEA_URL":    "http://127.0.0.1:1/", "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir, "GDR_NATS_URL": q.URL,
		"GDR_TRUST_DOMAIN": "ci.example.org", "GDR_PAYLOAD_KEY": key, "GDR_BOOTSTRAP_KEY": key,
		"GDR_GATEWAY_URL": "https://gw.example.org", "GDR_ASSIGNMENT_SIGNING_KEY": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=",
	} {
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Two tasks claimed: linux-1 has its Pod, which the scheduler cannot
	// place; linux-2 has no Pod yet.
	taskCtx, err := structpb.NewStruct(map[string]any{"server_url": "http://gitea.example.org/", "repository": "alice/demo", "run_id": "7"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{1, 2} {
		if err := q.Payloads.Put(ctx, fmt.Sprintf("linux-%d", id), &runnerv1.Task{Id: id, Context: taskCtx}); err != nil {
			t.Fatal(err)
		}
	}
	td, keys, err := taskassignment.NamingSettings{TrustDomain: "ci.example.org", MetadataPrefix: "gitea-dynamic-runner.io"}.Parse()
	if err != nil {
		t.Fatal(err)
	}
	pods, err := pod.New(pod.Config{Client: client, Namespace: ns, Keys: keys, TrustDomain: td, Cluster: "test-cluster", Entries: noEntries{},
		Pools: runnerpool.Pools{{Name: "linux", Backend: taskassignment.BackendPod, JobTimeout: runnerpool.Duration(time.Hour), Profile: json.RawMessage(profile)}}})
	if err != nil {
		t.Fatal(err)
	}
	a := assignmentFor(t, td, 1)
	e, err := pods.Create(ctx, a, executor.LaunchSpec{Metadata: keys.Metadata(a), Environment: map[string]string{"CI_RUNNER_CAPABILITY": "cap-s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	const unschedulable = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
	pod, err := client.CoreV1().Pods(ns).Get(ctx, e.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodPending
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: unschedulable, LastTransitionTime: metav1.Now()}}
	if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr bytes.Buffer
	if code := executeTo(ctx, []string{"status", "-o", "json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("recover status -o json exited %d:\n%s", code, stderr.String())
	}
	var r poolstatus.Report
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("-o json does not parse: %v\n%s", err, stdout.String())
	}
	if len(r.Pools) != 1 || r.Pools[0].Waiting != 2 || r.Pools[0].Queued != 0 || len(r.Pools[0].Tasks) != 2 {
		t.Fatalf("report = %+v", r)
	}
	want := map[string]poolstatus.Task{
		"linux-1": {Executor: e.Name, ExecutorPhase: "pending", Reason: "Unschedulable: " + unschedulable},
		"linux-2": {Reason: "no executor yet: the pod queue holds 0 undelivered, 0 delivered and unsettled"},
	}
	for _, task := range r.Pools[0].Tasks {
		w := want[task.Assignment]
		if task.URL != "http://gitea.example.org/alice/demo/actions/runs/7" || task.Executor != w.Executor || task.ExecutorPhase != w.ExecutorPhase || task.Reason != w.Reason {
			t.Errorf("task %s = %+v, want %+v", task.Assignment, task, w)
		}
	}
	stdout.Reset()
	if code := executeTo(ctx, []string{"status"}, &stdout, &stderr); code != 0 {
		t.Fatalf("recover status exited %d:\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), e.Name+" (pending): Unschedulable: 0/1 nodes are available") || strings.Contains(stdout.String(), "s3cret") {
		t.Fatalf("table:\n%s", stdout.String())
	}
	t.Logf("recover status:\n%s", stdout.String())
	if code := executeTo(ctx, []string{"status", "-o", "yaml"}, &stdout, &stderr); code != 2 {
		t.Fatalf("status -o yaml exited %d, want 2", code)
	}
}

func assignmentFor(t *testing.T, td spiffeid.TrustDomain, taskID int64) taskassignment.Assignment {
	t.Helper()
	identity, err := taskidentity.New(td, "alice/demo", "build", taskID)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: taskID, Pool: "linux"}, identity)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// noEntries is the SPIRE entry client of a backend that only creates Pods
// here: Create binds no identity, and no entry method is called.
type noEntries struct{ pod.EntryClient }
