package pod

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

const testTemplate = `{"podTemplate":{"metadata":{"labels":{"team":"ci"}},"spec":{"containers":[{"name":"runner","image":"runner:v1"}]}}}`

func testKeys(t *testing.T) taskassignment.Keys {
	t.Helper()
	k, err := taskassignment.NewKeys("ci.example.org")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestParseProfile(t *testing.T) {
	keys := testKeys(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("spec:\n  containers:\n  - name: runner\n    image: runner:v2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unknown := filepath.Join(dir, "unknown.yaml")
	if err := os.WriteFile(unknown, []byte("spec:\n  containers:\n  - name: runner\n    image: runner:v2\n    imagePulPolicy: Always\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := func(s string) string { return `{"podTemplate":{"spec":` + s + `}}` }
	for _, tc := range []struct {
		name, profile string
		image         string // want, on success
		err           string // want a substring, on failure
	}{
		{name: "inline", profile: testTemplate, image: "runner:v1"},
		{name: "file", profile: `{"podTemplateFile":"` + good + `"}`, image: "runner:v2"},
		{name: "missing", profile: ``, err: "profile is missing"},
		{name: "empty", profile: `{}`, err: "set podTemplate or podTemplateFile"},
		{name: "both", profile: `{"podTemplateFile":"` + good + `","podTemplate":{}}`, err: "both set"},
		{name: "unknown profile field", profile: `{"template":{}}`, err: `unknown field "template"`},
		{name: "unknown template field", profile: spec(`{"containerz":[]}`), err: `unknown field "containerz"`},
		{name: "unknown field in file", profile: `{"podTemplateFile":"` + unknown + `"}`, err: "imagePulPolicy"},
		{name: "file missing", profile: `{"podTemplateFile":"/nonexistent/t.yaml"}`, err: "podTemplateFile"},
		{name: "no runner", profile: spec(`{"containers":[{"name":"main","image":"x"}]}`), err: `podTemplate spec.containers: no container named "runner"`},
		{name: "runner only as init container", profile: spec(`{"initContainers":[{"name":"runner","image":"x"}],"containers":[{"name":"main","image":"x"}]}`), err: "no container named"},
		{name: "no image", profile: spec(`{"containers":[{"name":"runner"}]}`), err: "spec.containers[runner].image: empty"},
		{name: "restart always", profile: spec(`{"restartPolicy":"Always","containers":[{"name":"runner","image":"x"}]}`), err: "spec.restartPolicy"},
		{name: "restart never", profile: spec(`{"restartPolicy":"Never","containers":[{"name":"runner","image":"x"}]}`), image: "x"},
		{name: "named", profile: `{"podTemplate":{"metadata":{"name":"x"},"spec":{"containers":[{"name":"runner","image":"x"}]}}}`, err: "metadata: name"},
		{name: "reserved label", profile: `{"podTemplate":{"metadata":{"labels":{"ci.example.org/runner":"true"}},"spec":{"containers":[{"name":"runner","image":"x"}]}}}`, err: "metadata.labels"},
		{name: "reserved annotation", profile: `{"podTemplate":{"metadata":{"annotations":{"ci.example.org/spiffe-id":"x"}},"spec":{"containers":[{"name":"runner","image":"x"}]}}}`, err: "metadata.annotations"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := ParseProfile(json.RawMessage(tc.profile), keys)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tmpl.Spec.Containers[runnerIndex(tmpl.Spec.Containers)].Image; got != tc.image {
				t.Fatalf("runner image %q, want %q", got, tc.image)
			}
		})
	}
}

func TestPhaseOf(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		phase    corev1.PodPhase
		deleting bool
		want     executor.Phase
	}{
		{"", false, executor.PhasePending},
		{corev1.PodPending, false, executor.PhasePending},
		{corev1.PodRunning, false, executor.PhaseRunning},
		{corev1.PodSucceeded, false, executor.PhaseSucceeded},
		{corev1.PodFailed, false, executor.PhaseFailed},
		{corev1.PodUnknown, false, executor.PhaseUnknown},
		{"Hibernating", false, executor.PhaseUnknown},
		{corev1.PodPending, true, executor.PhaseUnknown},
		{corev1.PodRunning, true, executor.PhaseUnknown},
		{corev1.PodSucceeded, true, executor.PhaseUnknown},
		{corev1.PodFailed, true, executor.PhaseUnknown},
	} {
		pod := &corev1.Pod{Status: corev1.PodStatus{Phase: tc.phase}}
		if tc.deleting {
			pod.DeletionTimestamp = &now
		}
		if got := PhaseOf(pod); got != tc.want {
			t.Errorf("phase %q deleting=%v: got %s, want %s", tc.phase, tc.deleting, got, tc.want)
		}
	}
}

func TestStuck(t *testing.T) {
	created := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	waiting := func(reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "runner", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "msg"}}}
	}
	for _, tc := range []struct {
		name   string
		phase  corev1.PodPhase
		status []corev1.ContainerStatus
		age    time.Duration
		want   string
	}{
		{"image pull failing, old", corev1.PodPending, []corev1.ContainerStatus{waiting("ImagePullBackOff")}, 3 * time.Minute, "container runner: ImagePullBackOff: msg"},
		{"first pull error, young", corev1.PodPending, []corev1.ContainerStatus{waiting("ErrImagePull")}, 10 * time.Second, ""},
		{"Secret not there yet", corev1.PodPending, []corev1.ContainerStatus{waiting("CreateContainerConfigError")}, 5 * time.Second, ""},
		{"Secret never came", corev1.PodPending, []corev1.ContainerStatus{waiting("CreateContainerConfigError")}, StuckAfter, "container runner: CreateContainerConfigError: msg"},
		{"bad image name", corev1.PodPending, []corev1.ContainerStatus{waiting("InvalidImageName")}, 5 * time.Minute, "container runner: InvalidImageName: msg"},
		{"still creating", corev1.PodPending, []corev1.ContainerStatus{waiting("ContainerCreating")}, time.Hour, ""},
		{"not scheduled", corev1.PodPending, nil, time.Hour, ""},
		{"running", corev1.PodRunning, []corev1.ContainerStatus{waiting("ImagePullBackOff")}, time.Hour, ""},
		// A service's sidecar keeps exiting (or failing its startup probe)
		// before the runner starts.
		{"service crashing", corev1.PodPending, []corev1.ContainerStatus{waiting("CrashLoopBackOff")}, 3 * time.Minute, "container runner: CrashLoopBackOff: msg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)},
				Status: corev1.PodStatus{Phase: tc.phase, ContainerStatuses: tc.status}}
			if got := Stuck(pod, created.Add(tc.age)); got != tc.want {
				t.Fatalf("Stuck() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestEntryID(t *testing.T) {
	valid := regexp.MustCompile(`^[-._0-9A-Za-z]{1,255}$`)
	for _, tc := range []struct{ prefix, id string }{
		{"gdr-", "linux-1"},
		{"gdr-", "linux-2"},
		{"gdr-", "linux-12"},
		{"other.prefix_", "linux-1"},
		{strings.Repeat("p", MaxEntryIDPrefixLength), "a-9223372036854775807"},
	} {
		got := EntryID(tc.prefix, tc.id)
		if again := EntryID(tc.prefix, tc.id); again != got {
			t.Errorf("EntryID(%q, %q) not deterministic: %q then %q", tc.prefix, tc.id, got, again)
		}
		if !strings.HasPrefix(got, tc.prefix) || len(got) != len(tc.prefix)+entryIDHashLength || !valid.MatchString(got) {
			t.Errorf("EntryID(%q, %q) = %q: not prefix + %d hex digits within SPIRE's alphabet", tc.prefix, tc.id, got, entryIDHashLength)
		}
		if strings.Contains(got, tc.id) {
			t.Errorf("EntryID(%q, %q) = %q shows the assignment ID", tc.prefix, tc.id, got)
		}
	}
	if EntryID("gdr-", "linux-1") == EntryID("gdr-", "linux-2") {
		t.Error("distinct assignments share an entry ID")
	}
	for _, bad := range []string{"", "a/b", "a b", "ü", strings.Repeat("p", MaxEntryIDPrefixLength+1)} {
		if validEntryIDPrefix(bad) == nil {
			t.Errorf("entry ID prefix %q accepted", bad)
		}
	}
}

func TestCompareEntry(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	id := spiffeid.RequireFromPath(td, "/repo/o/r/task/1")
	parent, _ := agentID(td, "c1", "node-1")
	want := podEntry("gdr-x", id, parent, "jobs", "uid-1", 100)
	other := spiffeid.RequireFromPath(td, "/repo/o/r/task/2")
	parent2, _ := agentID(td, "c1", "node-2")
	for _, tc := range []struct {
		name string
		got  *types.Entry
		want entryMatch
	}{
		{"same", podEntry("gdr-x", id, parent, "jobs", "uid-1", 100), entrySame},
		{"same but expiry", podEntry("gdr-x", id, parent, "jobs", "uid-1", 999), entrySame},
		{"other pod", podEntry("gdr-x", id, parent, "jobs", "uid-2", 100), entryStale},
		{"other namespace", podEntry("gdr-x", id, parent, "elsewhere", "uid-1", 100), entryStale},
		{"other node", podEntry("gdr-x", id, parent2, "jobs", "uid-1", 100), entryStale},
		{"other identity", podEntry("gdr-x", other, parent, "jobs", "uid-1", 100), entryForeign},
	} {
		if got := compareEntry(tc.got, want); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// nopEntries is an EntryClient for tests that never bind.
type nopEntries struct{}

func (nopEntries) BatchCreateEntry(context.Context, *entryv1.BatchCreateEntryRequest, ...grpc.CallOption) (*entryv1.BatchCreateEntryResponse, error) {
	return nil, errors.New("not used")
}

func (nopEntries) GetEntry(context.Context, *entryv1.GetEntryRequest, ...grpc.CallOption) (*types.Entry, error) {
	return nil, errors.New("not used")
}

func (nopEntries) BatchDeleteEntry(context.Context, *entryv1.BatchDeleteEntryRequest, ...grpc.CallOption) (*entryv1.BatchDeleteEntryResponse, error) {
	return nil, errors.New("not used")
}

func testConfig(t *testing.T) Config {
	t.Helper()
	return Config{
		Client:      fake.NewClientset(),
		Namespace:   "ci",
		Keys:        testKeys(t),
		TrustDomain: spiffeid.RequireTrustDomainFromString("ci.example.org"),
		Pools: runnerpool.Pools{
			{Name: "linux", Backend: taskassignment.BackendPod, JobTimeout: runnerpool.Duration(90 * time.Minute), Profile: json.RawMessage(testTemplate)},
			{Name: "sandbox", Backend: taskassignment.BackendOpenSandbox},
		},
		Entries: nopEntries{},
		Cluster: "c1",
	}
}

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		err    string
	}{
		{"ok", func(*Config) {}, ""},
		{"no client", func(c *Config) { c.Client = nil }, "no Kubernetes client"},
		{"no entries", func(c *Config) { c.Entries = nil }, "no SPIRE entry client"},
		{"no keys", func(c *Config) { c.Keys = taskassignment.Keys{} }, "no metadata keys"},
		{"no trust domain", func(c *Config) { c.TrustDomain = spiffeid.TrustDomain{} }, "no trust domain"},
		{"bad namespace", func(c *Config) { c.Namespace = "CI" }, `namespace "CI"`},
		{"no cluster", func(c *Config) { c.Cluster = "" }, "cluster name"},
		{"bad cluster", func(c *Config) { c.Cluster = "a/b" }, "cluster name"},
		{"bad entry prefix", func(c *Config) { c.EntryIDPrefix = "a/b" }, "entry ID prefix"},
		{"bad name prefix", func(c *Config) { c.NamePrefix = "GDR-" }, "name prefix"},
		{"negative margin", func(c *Config) { c.ExpiryMargin = -time.Second }, "expiry margin"},
		{"no pod pool", func(c *Config) { c.Pools = c.Pools[1:] }, "no runner pool uses the pod backend"},
		{"bad profile names pool and field", func(c *Config) {
			c.Pools[0].Profile = json.RawMessage(`{"podTemplate":{"spec":{"containers":[{"name":"runner"}]}}}`)
		}, `pool "linux": profile podTemplate spec.containers[runner].image: empty`},
		{"no profile", func(c *Config) { c.Pools[0].Profile = nil }, `pool "linux": profile is missing`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			tc.change(&cfg)
			_, err := New(cfg)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
		})
	}
}

func testAssignment(t testing.TB, taskID int64, image string) taskassignment.Assignment {
	t.Helper()
	a, err := newAssignment(taskID, image)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// newAssignment is the assignment of task taskID of Owner/Repo in pool linux.
func newAssignment(taskID int64, image string) (taskassignment.Assignment, error) {
	id, err := taskidentity.New(spiffeid.RequireTrustDomainFromString("ci.example.org"), "Owner/Repo", "build", taskID)
	if err != nil {
		return taskassignment.Assignment{}, err
	}
	return taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: taskID, Pool: "linux", Image: image}, id)
}

const secretValue = "s3cr3t-capability-value"

func launch(keys taskassignment.Keys, a taskassignment.Assignment) executor.LaunchSpec {
	return executor.LaunchSpec{Metadata: keys.Metadata(a), Environment: map[string]string{"CI_RUNNER_CAPABILITY": secretValue, "CI_ASSIGNMENT_ID": a.ID}}
}

// TestCreateCrashWindow covers the logic of the window between the Pod and
// its Secret with the fake clientset (no server validation); the e2e tests
// repeat it against a real kube-apiserver.
func TestCreateCrashWindow(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	client := fake.NewClientset()
	cfg.Client = client
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := testAssignment(t, 7, "node:22")
	spec := launch(cfg.Keys, a)

	// The Secret's first write fails: the Pod exists without it.
	failed := false
	client.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failed {
			return false, nil, nil
		}
		failed = true
		return true, nil, apierrors.NewBadRequest("rejected data " + secretValue)
	})
	_, err = b.Create(ctx, a, spec)
	if err == nil {
		t.Fatal("Create succeeded although the Secret was rejected")
	}
	if strings.Contains(err.Error(), secretValue) {
		t.Fatalf("error shows a credential: %v", err)
	}
	pod, err := client.CoreV1().Pods("ci").Get(ctx, "gdr-linux-7", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := json.Marshal(pod); strings.Contains(string(got), secretValue) {
		t.Fatal("the Pod object holds a credential")
	}
	if e, err := b.Find(ctx, a.ID); err != nil || e != nil {
		t.Fatalf("Find of a Pod without its Secret = %+v, %v; want nil, nil", e, err)
	}

	// Create again (the worker does, since Find said absent) completes it.
	e, err := b.Create(ctx, a, spec)
	if err != nil {
		t.Fatal(err)
	}
	if e.Name != "gdr-linux-7" || e.Phase != executor.PhasePending || e.IdentityTarget != "" {
		t.Fatalf("executor %+v", e)
	}
	s, err := client.CoreV1().Secrets("ci").Get(ctx, "gdr-linux-7-env", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(s.Data["CI_RUNNER_CAPABILITY"]) != secretValue || !ownedBy(s, pod.UID) {
		t.Fatalf("secret %+v", s.ObjectMeta)
	}
	if found, err := b.Find(ctx, a.ID); err != nil || found == nil || *found != *e {
		t.Fatalf("Find = %+v, %v; want %+v", found, err, e)
	}
	c := pod.Spec.Containers[0]
	if c.Image != "node:22" || *pod.Spec.ActiveDeadlineSeconds != 5400 || pod.Spec.RestartPolicy != corev1.RestartPolicyNever ||
		len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef.Name != "gdr-linux-7-env" || pod.Labels["team"] != "ci" {
		t.Fatalf("pod spec %+v labels %v", pod.Spec, pod.Labels)
	}
}

func TestRecoverSkipsCorrupt(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	client := fake.NewClientset()
	cfg.Client = client
	var corrupt []Corrupt
	cfg.OnCorrupt = func(c Corrupt) { corrupt = append(corrupt, c) }
	cfg.CorruptEvents = true
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	good := testAssignment(t, 1, "")
	if _, err := b.Create(ctx, good, launch(cfg.Keys, good)); err != nil {
		t.Fatal(err)
	}
	m := cfg.Keys.Metadata(testAssignment(t, 2, ""))
	for _, bad := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "nil-maps", Labels: map[string]string{cfg.Keys.Runner: "true"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "wrong-name", Labels: m.Labels, Annotations: m.Annotations}},
		{ObjectMeta: metav1.ObjectMeta{Name: "gdr-linux-2", Labels: m.Labels, Annotations: map[string]string{
			cfg.Keys.Repository: "owner/repo", cfg.Keys.Job: "build", cfg.Keys.SPIFFEID: "spiffe://evil.example/repo/owner/repo/task/2"}}},
	} {
		if _, err := client.CoreV1().Pods("ci").Create(ctx, bad, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.RecoverAssignments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !reflect.DeepEqual(got[0], good) {
		t.Fatalf("recovered %+v", got)
	}
	if len(corrupt) != 3 {
		t.Fatalf("corrupt reports %+v", corrupt)
	}
	events, err := client.CoreV1().Events("ci").List(ctx, metav1.ListOptions{})
	if err != nil || len(events.Items) != 3 {
		t.Fatalf("events %d, %v", len(events.Items), err)
	}
	for _, ev := range events.Items {
		if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.Kind != "Pod" {
			t.Fatalf("event %+v", ev)
		}
	}
}

// Discard deletes a Pod Create left without its Secret (Find does not see
// it), and nothing else: not a Pod of that name carrying another assignment,
// not a missing one.
func TestDiscardHalfMadePod(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	client := fake.NewClientset()
	cfg.Client, cfg.Entries = client, unboundEntries{}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := testAssignment(t, 7, "node:22")
	client.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInternalError(context.DeadlineExceeded) // killed before the Secret
	})
	if _, err := b.Create(ctx, a, launch(cfg.Keys, a)); err == nil {
		t.Fatal("Create succeeded without its Secret")
	}
	if e, err := b.Find(ctx, a.ID); err != nil || e != nil {
		t.Fatalf("Find = %+v, %v; want nothing", e, err)
	}
	if err := b.Discard(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("ci").Get(ctx, b.PodName(a.ID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the half-made Pod is still there: %v", err)
	}
	if err := b.Discard(ctx, a.ID); err != nil { // nothing left: success
		t.Fatal(err)
	}
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: b.PodName("linux-8"), Namespace: "ci",
		Labels: map[string]string{cfg.Keys.Runner: "true", cfg.Keys.AssignmentID: "linux-9"}}}
	if _, err := client.CoreV1().Pods("ci").Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Discard(ctx, "linux-8"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("ci").Get(ctx, foreign.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("Discard deleted a Pod of another assignment: %v", err)
	}
}

// unboundEntries is an EntryClient with no entry: deleting one finds nothing.
type unboundEntries struct{ nopEntries }

func (unboundEntries) BatchDeleteEntry(_ context.Context, req *entryv1.BatchDeleteEntryRequest, _ ...grpc.CallOption) (*entryv1.BatchDeleteEntryResponse, error) {
	var res []*entryv1.BatchDeleteEntryResponse_Result
	for _, id := range req.GetIds() {
		res = append(res, &entryv1.BatchDeleteEntryResponse_Result{Id: id, Status: &types.Status{Code: int32(codes.NotFound)}})
	}
	return &entryv1.BatchDeleteEntryResponse{Results: res}, nil
}
