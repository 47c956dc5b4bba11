//go:build e2e

package pod

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
)

// tasks is Gitea's view of tasks for the worker: terminal ones, and the
// reports received.
type tasks struct {
	mu       sync.Mutex
	terminal map[int64]bool
	reports  map[int64][]executor.Phase
}

func newTasks() *tasks {
	return &tasks{terminal: map[int64]bool{}, reports: map[int64][]executor.Phase{}}
}

func (s *tasks) Terminal(_ context.Context, id int64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.terminal[id], nil
}

// Report makes the task terminal, as Gitea does.
func (s *tasks) Report(_ context.Context, id int64, e executor.Executor) error {
	p := e.Phase
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reports[id] = append(s.reports[id], p)
	s.terminal[id] = true
	return nil
}

func (s *tasks) cancel(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.terminal[id] = true
}

type events struct {
	mu  sync.Mutex
	all []executor.Event
}

func (e *events) add(ev executor.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

// names returns and forgets the event names so far.
func (e *events) names() []executor.EventName {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []executor.EventName
	for _, ev := range e.all {
		out = append(out, ev.Name)
	}
	e.all = nil
	return out
}

// TestE2EWorker drives executor.Worker over this backend, a real
// kube-apiserver, a real spire-server and a real bootstrap.
func TestE2EWorker(t *testing.T) {
	env := newEnv(t)
	spire := spireenv.Start(t)
	ctx := ctxT(t)
	b := env.backend(t, spire.Entries())
	key := secretkey.Key(strings.Repeat("k", bootstrap.MinKeyLength))
	boot, err := bootstrap.New(key, "https://gateway.example.org:8443", spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	if err != nil {
		t.Fatal(err)
	}
	gitea := newTasks()
	var evs events
	w := executor.Worker{Backend: b, Tasks: gitea, Bootstrap: boot, Keys: env.keys, OnEvent: evs.add}
	node := env.ns + "-node"
	pods := env.client.CoreV1().Pods(env.ns)
	expect := func(step string, want ...executor.EventName) {
		t.Helper()
		if got := evs.names(); !slices.Equal(got, want) {
			t.Fatalf("%s: events %v, want %v", step, got, want)
		}
	}
	entryCount := func() int { return len(spire.AllEntries(t)) }

	t.Run("accept, run, succeed", func(t *testing.T) {
		a := testAssignment(t, 1, "node:22")
		ok, err := w.Accept(ctx, a)
		if err != nil || ok {
			t.Fatalf("Accept before scheduling = %v, %v; want false (identity target pending)", ok, err)
		}
		expect("first accept", executor.EventExecutorAbsent, executor.EventExecutorCreated, executor.EventIdentityTargetPending)
		name := b.PodName(a.ID)
		s, err := env.client.CoreV1().Secrets(env.ns).Get(ctx, SecretName(name), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want, _ := boot.Environment(a)
		// The runner container runs the job's image, and the runner is told.
		want[bootstrap.EnvJobImage] = "node:22"
		if len(s.Data) != len(want) {
			t.Fatalf("Secret holds %d variables, want %d", len(s.Data), len(want))
		}
		for k, v := range want {
			if string(s.Data[k]) != v {
				t.Fatalf("Secret variable %s differs from the bootstrap environment", k)
			}
		}
		if err := boot.Verify(a.ID, a.Task.ID, a.Identity.SPIFFEID, string(s.Data[bootstrap.EnvCapability])); err != nil {
			t.Fatal(err)
		}

		env.schedule(t, name, node, true)
		if ok, err := w.Accept(ctx, a); err != nil || !ok {
			t.Fatalf("Accept after scheduling = %v, %v", ok, err)
		}
		expect("second accept", executor.EventExecutorFound, executor.EventIdentityBound)
		if n := entryCount(); n != 1 {
			t.Fatalf("%d entries, want 1", n)
		}
		// A redelivery of the message: still fine, still one entry.
		if ok, err := w.Accept(ctx, a); err != nil || !ok {
			t.Fatalf("Accept again = %v, %v", ok, err)
		}
		evs.names()

		env.setPhase(t, name, corev1.PodRunning)
		if done, err := w.Finish(ctx, a); err != nil || done {
			t.Fatalf("Handle of a running executor = %v, %v", done, err)
		}
		expect("handle running", executor.EventIdentityBound)

		env.setPhase(t, name, corev1.PodSucceeded)
		if done, err := w.Finish(ctx, a); err != nil || !done {
			t.Fatalf("Handle of a succeeded executor = %v, %v", done, err)
		}
		expect("handle succeeded", executor.EventIdentityBound, executor.EventTaskReported, executor.EventExecutorDeleted)
		if got := gitea.reports[a.Task.ID]; !slices.Equal(got, []executor.Phase{executor.PhaseSucceeded}) {
			t.Fatalf("reports %v", got)
		}
		// A finished Pod is deleted at once (no kubelet has anything to stop).
		if _, err := pods.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("Pod after Handle: %v", err)
		}
		if _, err := env.client.CoreV1().Secrets(env.ns).Get(ctx, SecretName(name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("Secret after Handle: %v", err)
		}
		if n := entryCount(); n != 0 {
			t.Fatalf("%d entries after Handle, want 0", n)
		}
		// Recover runs again: Gitea says terminal, nothing is left.
		if done, err := w.Finish(ctx, a); err != nil || !done {
			t.Fatalf("Handle after the end = %v, %v", done, err)
		}
		expect("handle after the end", executor.EventTaskTerminal)
	})

	t.Run("cancelled while running", func(t *testing.T) {
		a := testAssignment(t, 2, "")
		if ok, err := w.Accept(ctx, a); err != nil || ok {
			t.Fatalf("Accept = %v, %v", ok, err)
		}
		env.schedule(t, b.PodName(a.ID), node, true)
		if ok, err := w.Accept(ctx, a); err != nil || !ok {
			t.Fatalf("Accept = %v, %v", ok, err)
		}
		env.setPhase(t, b.PodName(a.ID), corev1.PodRunning)
		gitea.cancel(a.Task.ID)
		evs.names()
		if done, err := w.Finish(ctx, a); err != nil || !done {
			t.Fatalf("Handle of a cancelled task = %v, %v", done, err)
		}
		expect("cancel", executor.EventTaskTerminal, executor.EventExecutorDeleted)
		if n := entryCount(); n != 0 {
			t.Fatalf("%d entries after the cancel, want 0", n)
		}
		// The Pod is being deleted (no kubelet confirms): Handle deletes again.
		e, err := b.Find(ctx, a.ID)
		if err != nil || e == nil || e.Phase != executor.PhaseUnknown {
			t.Fatalf("Find after the cancel = %+v, %v", e, err)
		}
		if done, err := w.Finish(ctx, a); err != nil || !done {
			t.Fatalf("Handle again = %v, %v", done, err)
		}
		if gitea.reports[a.Task.ID] != nil {
			t.Fatalf("a cancelled task was reported: %v", gitea.reports[a.Task.ID])
		}
	})

	t.Run("crash between Pod and Secret", func(t *testing.T) {
		a := testAssignment(t, 3, "")
		spec := executor.LaunchSpec{Metadata: env.keys.Metadata(a)}
		spec.Environment, _ = boot.Environment(a)
		// The first Create got as far as the Pod.
		pod, err := b.newPod(a, spec, b.pools["linux"])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		evs.names()
		if ok, err := w.Accept(ctx, a); err != nil || ok {
			t.Fatalf("Accept = %v, %v", ok, err)
		}
		expect("accept repairs", executor.EventExecutorAbsent, executor.EventExecutorCreated, executor.EventIdentityTargetPending)
		s, err := env.client.CoreV1().Secrets(env.ns).Get(ctx, SecretName(pod.Name), metav1.GetOptions{})
		if err != nil || string(s.Data[bootstrap.EnvCapability]) != spec.Environment[bootstrap.EnvCapability] {
			t.Fatalf("Secret after the repair: %v", err)
		}
	})

	t.Run("recover", func(t *testing.T) {
		// Two live executors (tasks 3 and 4) and one of a task Gitea failed
		// meanwhile (5); recover handles every one found.
		for _, id := range []int64{4, 5} {
			if _, err := w.Accept(ctx, testAssignment(t, id, "")); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range []int64{3, 4, 5} {
			env.schedule(t, b.PodName(fmt.Sprintf("linux-%d", id)), node, true)
		}
		gitea.cancel(5)
		found, err := b.RecoverAssignments(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, a := range found {
			ids = append(ids, a.Task.ID)
			if _, err := w.Finish(ctx, a); err != nil {
				t.Fatalf("Handle %s: %v", a.ID, err)
			}
		}
		slices.Sort(ids)
		// Task 2's Pod is still being deleted, so recover sees it too.
		if !slices.Equal(ids, []int64{2, 3, 4, 5}) {
			t.Fatalf("recovered tasks %v", ids)
		}
		if n := entryCount(); n != 2 {
			t.Fatalf("%d entries after recover, want 2 (tasks 3 and 4)", n)
		}
		// Task 5's Pod is bound to a node, so it is deleted gracefully.
		if p, err := pods.Get(ctx, b.PodName("linux-5"), metav1.GetOptions{}); !apierrors.IsNotFound(err) && (err != nil || p.DeletionTimestamp == nil) {
			t.Fatalf("Pod of the failed task 5 is not being deleted: %v", err)
		}
	})
}
