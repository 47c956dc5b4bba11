//go:build e2e

package pod

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
)

func TestE2ECreateFind(t *testing.T) {
	env := newEnv(t)
	ctx := ctxT(t)
	b := env.backend(t, nil)
	for _, tc := range []struct {
		name   string
		taskID int64
		image  string
		want   string
	}{
		{"template image", 1, "", "runner:v1"},
		{"job container image", 2, "node:22-bookworm", "node:22-bookworm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := testAssignment(t, tc.taskID, tc.image)
			spec := launch(env.keys, a)
			e, err := b.Create(ctx, a, spec)
			if err != nil {
				t.Fatal(err)
			}
			want := executor.Executor{Name: "gdr-" + a.ID, Phase: executor.PhasePending}
			if *e != want {
				t.Fatalf("Create = %+v, want %+v", *e, want)
			}
			pod, err := env.client.CoreV1().Pods(env.ns).Get(ctx, e.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := json.Marshal(pod)
			if strings.Contains(string(raw), secretValue) {
				t.Fatal("the Pod object holds a credential")
			}
			c := pod.Spec.Containers[0]
			if c.Image != tc.want {
				t.Errorf("runner image %q, want %q", c.Image, tc.want)
			}
			if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || pod.Spec.ActiveDeadlineSeconds == nil || *pod.Spec.ActiveDeadlineSeconds != 90*60 {
				t.Errorf("restartPolicy %q activeDeadlineSeconds %v", pod.Spec.RestartPolicy, pod.Spec.ActiveDeadlineSeconds)
			}
			if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != SecretName(e.Name) ||
				c.EnvFrom[0].SecretRef.Optional == nil || *c.EnvFrom[0].SecretRef.Optional {
				t.Errorf("envFrom %+v", c.EnvFrom)
			}
			for k, v := range spec.Metadata.Labels {
				if pod.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, pod.Labels[k], v)
				}
			}
			for k, v := range spec.Metadata.Annotations {
				if pod.Annotations[k] != v {
					t.Errorf("annotation %s = %q, want %q", k, pod.Annotations[k], v)
				}
			}
			if pod.Labels["team"] != "ci" {
				t.Errorf("template label lost: %v", pod.Labels)
			}
			s, err := env.client.CoreV1().Secrets(env.ns).Get(ctx, SecretName(e.Name), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != pod.UID || s.OwnerReferences[0].Kind != "Pod" ||
				s.OwnerReferences[0].Name != pod.Name || s.OwnerReferences[0].APIVersion != "v1" {
				t.Errorf("Secret owner references %+v, want the Pod %s", s.OwnerReferences, pod.UID)
			}
			if string(s.Data["CI_RUNNER_CAPABILITY"]) != secretValue {
				t.Errorf("Secret data keys %v", len(s.Data))
			}

			// Idempotent: a second Create meets AlreadyExists and returns the Pod.
			again, err := b.Create(ctx, a, spec)
			if err != nil || *again != *e {
				t.Fatalf("second Create = %+v, %v", again, err)
			}
			found, err := b.Find(ctx, a.ID)
			if err != nil || found == nil || *found != *e {
				t.Fatalf("Find = %+v, %v", found, err)
			}
		})
	}
	if e, err := b.Find(ctx, "linux-999"); err != nil || e != nil {
		t.Fatalf("Find of an unknown assignment = %+v, %v", e, err)
	}
}

// TestE2EServerValidation shows the real server's validation at work where
// the backend passes user input through: a pool template's labels.
func TestE2EServerValidation(t *testing.T) {
	env := newEnv(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		length int
		ok     bool
	}{{63, true}, {64, false}} {
		t.Run(fmt.Sprint(tc.length), func(t *testing.T) {
			cfg := env.config(nil)
			cfg.Pools[0].Profile = json.RawMessage(`{"podTemplate":{"metadata":{"labels":{"long":"` + strings.Repeat("v", tc.length) +
				`"}},"spec":{"containers":[{"name":"runner","image":"runner:v1"}]}}}`)
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			a := testAssignment(t, int64(tc.length), "")
			_, err = b.Create(ctx, a, launch(env.keys, a))
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "must be no more than 63") {
				t.Fatalf("Create with a 64-character label value: %v; want the server's Invalid error", err)
			}
			if e, err := b.Find(ctx, a.ID); err != nil || e != nil {
				t.Fatalf("Find after a rejected Create = %+v, %v", e, err)
			}
		})
	}
	// The server also rejects what no Keys can produce: a label value of 64
	// characters on an assignment-id label.
	b := env.backend(t, nil)
	a := testAssignment(t, 3, "")
	spec := launch(env.keys, a)
	spec.Metadata.Labels[env.keys.Pool] = strings.Repeat("p", 64)
	if _, err := b.Create(ctx, a, spec); !apierrors.IsInvalid(err) {
		t.Fatalf("Create with a 64-character contract label: %v; want Invalid", err)
	}
}

func TestE2ESelectors(t *testing.T) {
	env := newEnv(t)
	other := newEnv(t) // another namespace, same labels
	ctx := ctxT(t)
	b := env.backend(t, nil)
	ob := other.backend(t, nil)
	for id := int64(1); id <= 3; id++ {
		a := testAssignment(t, id, "")
		if _, err := b.Create(ctx, a, launch(env.keys, a)); err != nil {
			t.Fatal(err)
		}
	}
	a4 := testAssignment(t, 4, "")
	if _, err := ob.Create(ctx, a4, launch(env.keys, a4)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id   string
		want string // "" = absent
	}{
		{"linux-1", "gdr-linux-1"}, {"linux-2", "gdr-linux-2"}, {"linux-3", "gdr-linux-3"},
		{"linux-4", ""}, // only in the other namespace
		{"linux-11", ""},
	} {
		e, err := b.Find(ctx, tc.id)
		if err != nil {
			t.Fatal(err)
		}
		if got := ""; e != nil {
			got = e.Name
			if got != tc.want {
				t.Errorf("Find(%s) = %s, want %s", tc.id, got, tc.want)
			}
		} else if tc.want != "" {
			t.Errorf("Find(%s) = nil, want %s", tc.id, tc.want)
		}
	}

	// A Pod that claims an assignment under another name is an error.
	m := env.keys.Metadata(testAssignment(t, 5, ""))
	squatter := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "squatter", Labels: m.Labels, Annotations: m.Annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "runner", Image: "x"}}},
	}
	if _, err := env.client.CoreV1().Pods(env.ns).Create(ctx, squatter, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if e, err := b.Find(ctx, "linux-5"); err == nil || !strings.Contains(err.Error(), "squatter") {
		t.Fatalf("Find with a squatting Pod = %+v, %v; want an error naming it", e, err)
	}
	// ... and a Pod of the deterministic name of another assignment blocks Create.
	taken := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gdr-linux-6", Labels: m.Labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "runner", Image: "x"}}},
	}
	if _, err := env.client.CoreV1().Pods(env.ns).Create(ctx, taken, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a6 := testAssignment(t, 6, "")
	if _, err := b.Create(ctx, a6, launch(env.keys, a6)); err == nil || !strings.Contains(err.Error(), "belongs to assignment") {
		t.Fatalf("Create over another assignment's Pod: %v", err)
	}
}

// TestE2ESecretRepair walks the crash window between the Pod and its Secret.
func TestE2ESecretRepair(t *testing.T) {
	env := newEnv(t)
	ctx := ctxT(t)
	b := env.backend(t, nil)
	a := testAssignment(t, 1, "")
	spec := launch(env.keys, a)
	e, err := b.Create(ctx, a, spec)
	if err != nil {
		t.Fatal(err)
	}
	secrets := env.client.CoreV1().Secrets(env.ns)

	// 1. The Secret is missing (a crash right after the Pod was created).
	if err := secrets.Delete(ctx, SecretName(e.Name), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Find(ctx, a.ID); err != nil || got != nil {
		t.Fatalf("Find of a Pending Pod without its Secret = %+v, %v; want absent", got, err)
	}
	if _, err := b.Create(ctx, a, spec); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Find(ctx, a.ID); err != nil || got == nil {
		t.Fatalf("Find after the repair = %+v, %v", got, err)
	}

	// 2. The Secret belongs to an earlier Pod of the same name (the Pod was
	// replaced; without a garbage collector its Secret stayed).
	pods := env.client.CoreV1().Pods(env.ns)
	old, err := pods.Get(ctx, e.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	if err := pods.Delete(ctx, e.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	fresh := old.DeepCopy()
	fresh.ResourceVersion, fresh.UID, fresh.CreationTimestamp = "", "", metav1.Time{}
	fresh, err = pods.Create(ctx, fresh, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Find(ctx, a.ID); err != nil || got != nil {
		t.Fatalf("Find of a Pod with an earlier Pod's Secret = %+v, %v; want absent", got, err)
	}
	if _, err := b.Create(ctx, a, spec); err != nil {
		t.Fatal(err)
	}
	s, err := secrets.Get(ctx, SecretName(e.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != fresh.UID {
		t.Fatalf("Secret owners %+v, want the new Pod %s", s.OwnerReferences, fresh.UID)
	}

	// 3. A Running Pod no longer needs its Secret: Find does not look.
	env.setPhase(t, e.Name, corev1.PodRunning)
	if err := secrets.Delete(ctx, SecretName(e.Name), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Find(ctx, a.ID); err != nil || got == nil || got.Phase != executor.PhaseRunning {
		t.Fatalf("Find of a Running Pod = %+v, %v", got, err)
	}
}

func TestE2EPhasesAndTarget(t *testing.T) {
	env := newEnv(t)
	ctx := ctxT(t)
	b := env.backend(t, deleteOnly{})
	a := testAssignment(t, 1, "")
	e, err := b.Create(ctx, a, launch(env.keys, a))
	if err != nil {
		t.Fatal(err)
	}
	find := func() *executor.Executor {
		t.Helper()
		got, err := b.Find(ctx, a.ID)
		if err != nil || got == nil {
			t.Fatalf("Find = %+v, %v", got, err)
		}
		return got
	}
	if got := find(); got.IdentityTarget != "" || got.Phase != executor.PhasePending {
		t.Fatalf("unscheduled: %+v", got)
	}
	node := env.ns + "-node"
	env.schedule(t, e.Name, node, false)
	if got := find(); got.IdentityTarget != "" {
		t.Fatalf("scheduled to a Node that does not exist: target %q, want pending", got.IdentityTarget)
	}
	uid := env.node(t, node)
	if got := find(); got.IdentityTarget != uid {
		t.Fatalf("target %q, want Node UID %s", got.IdentityTarget, uid)
	}
	for _, tc := range []struct {
		phase corev1.PodPhase
		want  executor.Phase
	}{
		{corev1.PodRunning, executor.PhaseRunning},
		{corev1.PodUnknown, executor.PhaseUnknown},
		{corev1.PodRunning, executor.PhaseRunning},
		{corev1.PodSucceeded, executor.PhaseSucceeded},
		{corev1.PodFailed, executor.PhaseFailed},
	} {
		env.setPhase(t, e.Name, tc.phase)
		if got := find(); got.Phase != tc.want || got.IdentityTarget != uid {
			t.Errorf("status %s: %+v, want %s on %s", tc.phase, got, tc.want, uid)
		}
	}

	// A Running Pod on a node is deleted gracefully: with no kubelet to
	// confirm, it stays, being deleted: PhaseUnknown.
	b2 := testAssignment(t, 2, "")
	e2, err := b.Create(ctx, b2, launch(env.keys, b2))
	if err != nil {
		t.Fatal(err)
	}
	env.schedule(t, e2.Name, node, true)
	env.setPhase(t, e2.Name, corev1.PodRunning)
	if err := b.Delete(ctx, e2); err != nil {
		t.Fatal(err)
	}
	got, err := b.Find(ctx, b2.ID)
	if err != nil || got == nil || got.Phase != executor.PhaseUnknown {
		t.Fatalf("Find of a Pod being deleted = %+v, %v; want PhaseUnknown", got, err)
	}
	if err := b.Delete(ctx, got); err != nil {
		t.Fatalf("Delete of a Pod being deleted: %v", err)
	}
}

func TestE2EDelete(t *testing.T) {
	env := newEnv(t)
	ctx := ctxT(t)
	b := env.backend(t, nil)
	a := testAssignment(t, 1, "")
	e, err := b.Create(ctx, a, launch(env.keys, a))
	if err != nil {
		t.Fatal(err)
	}
	// nopEntries fails every call: give Delete an entry client that works.
	b.entries = deleteOnly{}
	for i := 0; i < 2; i++ {
		if err := b.Delete(ctx, e); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if _, err := env.client.CoreV1().Pods(env.ns).Get(ctx, e.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Pod after Delete: %v", err)
	}
	if _, err := env.client.CoreV1().Secrets(env.ns).Get(ctx, SecretName(e.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Secret after Delete: %v", err)
	}
	if got, err := b.Find(ctx, a.ID); err != nil || got != nil {
		t.Fatalf("Find after Delete = %+v, %v", got, err)
	}
	if err := b.Delete(ctx, &executor.Executor{Name: "not-ours"}); err == nil {
		t.Fatal("Delete of a foreign name succeeded")
	}
}

// TestE2ERecoverPagination lists 520 executor Pods (and 3 corrupt ones, and
// one of another installation) page by page, counting the requests.
func TestE2ERecoverPagination(t *testing.T) {
	env := newEnv(t)
	ctx := ctxT(t)
	b := env.backend(t, nil)
	const n = 520
	createPods(t, env, b, 1, n)
	m := env.keys.Metadata(testAssignment(t, 9999, ""))
	bad := []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "no-annotations", Labels: m.Labels}},
		{ObjectMeta: metav1.ObjectMeta{Name: "misnamed", Labels: m.Labels, Annotations: m.Annotations}},
		{ObjectMeta: metav1.ObjectMeta{Name: "gdr-linux-9999", Labels: m.Labels, Annotations: map[string]string{
			env.keys.Repository: "owner/repo", env.keys.Job: "build", env.keys.SPIFFEID: "spiffe://elsewhere.example/repo/owner/repo/task/9999"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "not-ours", Labels: map[string]string{env.keys.Runner: "false"}}},
	}
	for _, p := range bad {
		p.Spec.Containers = []corev1.Container{{Name: "runner", Image: "x"}}
		if _, err := env.client.CoreV1().Pods(env.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		pageSize  int64
		wantCalls int64
	}{{0, 2}, {100, 6}, {1000, 1}} {
		t.Run(fmt.Sprint(tc.pageSize), func(t *testing.T) {
			var calls atomic.Int64
			cfg := env.config(nil)
			cfg.Client = countingClient(t, env.plane.RESTConfig(), &calls)
			cfg.PageSize = tc.pageSize
			var (
				mu      sync.Mutex
				corrupt = map[string]error{}
			)
			cfg.OnCorrupt = func(c Corrupt) {
				mu.Lock()
				defer mu.Unlock()
				corrupt[c.Pod] = c.Err
			}
			rb, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := rb.RecoverAssignments(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != n {
				t.Fatalf("recovered %d assignments, want %d", len(got), n)
			}
			seen := map[string]bool{}
			for _, a := range got {
				if seen[a.ID] {
					t.Fatalf("assignment %s listed twice", a.ID)
				}
				seen[a.ID] = true
				if want := testAssignment(t, a.Task.ID, ""); !reflect.DeepEqual(a, want) {
					t.Fatalf("recovered %+v, want %+v", a, want)
				}
			}
			if len(corrupt) != 3 || corrupt["no-annotations"] == nil || corrupt["misnamed"] == nil || corrupt["gdr-linux-9999"] == nil {
				t.Fatalf("corrupt reports %v", corrupt)
			}
			if c := calls.Load(); c != tc.wantCalls {
				t.Fatalf("%d API calls, want %d pages", c, tc.wantCalls)
			}
		})
	}
	// With CorruptEvents, each corrupt Pod also gets a Warning Event: one more
	// call each.
	var calls atomic.Int64
	cfg := env.config(nil)
	cfg.Client = countingClient(t, env.plane.RESTConfig(), &calls)
	cfg.CorruptEvents = true
	rb, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rb.RecoverAssignments(ctx); err != nil {
		t.Fatal(err)
	}
	if c := calls.Load(); c != 2+3 {
		t.Fatalf("%d API calls, want 2 pages + 3 events", c)
	}
	events, err := env.client.CoreV1().Events(env.ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=CorruptExecutorMetadata"})
	if err != nil || len(events.Items) != 3 {
		t.Fatalf("events: %d, %v", len(events.Items), err)
	}
}

// createPods creates the executors of tasks first..last through the
// backend, 16 at a time.
func createPods(t testing.TB, env e2eEnv, b *Backend, first, last int64) {
	t.Helper()
	ctx := ctxT(t)
	ids := make(chan int64)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				a, err := newAssignment(id, "")
				if err == nil {
					_, err = b.Create(ctx, a, launch(env.keys, a))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
	for id := first; id <= last && err == nil; id++ {
		select {
		case ids <- id:
		case err = <-errs:
		}
	}
	close(ids)
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs
	}
	if err != nil {
		t.Fatal(err)
	}
}

// deleteOnly is an EntryClient whose deletes find nothing.
type deleteOnly struct{ nopEntries }

func (deleteOnly) BatchDeleteEntry(_ context.Context, req *entryv1.BatchDeleteEntryRequest, _ ...grpc.CallOption) (*entryv1.BatchDeleteEntryResponse, error) {
	resp := &entryv1.BatchDeleteEntryResponse{}
	for _, id := range req.Ids {
		resp.Results = append(resp.Results, &entryv1.BatchDeleteEntryResponse_Result{
			Id: id, Status: &spiretypes.Status{Code: int32(codes.NotFound), Message: "not found"}})
	}
	return resp, nil
}

// A Pod whose runner container waits on an image that cannot be pulled is a
// failed executor with kubelet's reason once it has waited StuckAfter, read
// through the real API server: not a Pending Pod for its whole deadline.
func TestE2EStuckPodIsFailedWithItsReason(t *testing.T) {
	env := newEnv(t)
	ctx := ctxT(t)
	later := time.Now()
	cfg := env.config(deleteOnly{})
	cfg.Now = func() time.Time { return later }
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := testAssignment(t, 3, "")
	e, err := b.Create(ctx, a, launch(env.keys, a))
	if err != nil {
		t.Fatal(err)
	}
	p, err := env.client.CoreV1().Pods(env.ns).Get(ctx, e.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodPending
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "runner", Image: "registry.invalid/nope:1",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: `Back-off pulling image "registry.invalid/nope:1"`}}}}
	if _, err := env.client.CoreV1().Pods(env.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Find(ctx, a.ID); err != nil || got.Phase != executor.PhasePending || got.Reason != "" {
		t.Fatalf("just created: %+v, %v; want pending", got, err)
	}
	later = time.Now().Add(StuckAfter + time.Second)
	got, err := b.Find(ctx, a.ID)
	if err != nil || got.Phase != executor.PhaseFailed || !strings.Contains(got.Reason, "ImagePullBackOff") || !strings.Contains(got.Reason, "registry.invalid/nope:1") {
		t.Fatalf("stuck for %v: %+v, %v; want failed with kubelet's reason", StuckAfter, got, err)
	}
}
