//go:build e2e

package deploy

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
)

// killedAckWait is the pod consumer's AckWait while handleKilled runs: short, so that the
// test waits for the redelivery a crash costs (not the shipped 5 minutes), and long enough
// against the few seconds the fault takes to set up that a hand-back (a nak, which comes back
// at once) cannot pass for it.
const killedAckWait = 20 * time.Second

// handleKilled kills the handle process with SIGKILL on the node (no SIGTERM: no chance to
// nak or ack) while it holds the assignment unsettled in the middle of Create: it mints the
// executor's SVID (GDR_POD_IDENTITY=minted) before it creates the Pod, and the SPIRE server
// is paused (SIGSTOP), so the mint hangs. The fault is asserted first: the message delivered
// and unacknowledged, no executor Pod yet, the process found by its Pod's cgroup and gone
// after the kill. Then the message must come back no sooner than AckWait after its delivery
// (a crash, not a hand-back), a handle other than the killed one must accept it after the
// kill and create the executor, and the job must succeed, its executor created once.
func (in *installation) handleKilled(ctx context.Context, t *testing.T, repo string) {
	restore := in.setAckWait(ctx, t, killedAckWait)
	defer restore()
	w, err := in.cs.CoreV1().Pods(jobsNamespace).Watch(ctx, metav1.ListOptions{LabelSelector: executorSelector})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	created := make(chan string, 16)
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added && p.Annotations[repositoryAnnotation] == repo {
				created <- p.Name
			}
		}
		close(created)
	}()
	in.spire.Pause(t)
	paused := true
	resume := func() {
		if paused {
			in.spire.Resume(t)
			paused = false
		}
	}
	defer resume()
	in.g.PushWorkflow(t, repo, ".gitea/workflows/crash.yml", `on: push
jobs:
  crash:
    runs-on: ubuntu-latest
    steps:
      - run: echo "ran in $(cat /etc/hostname)"
`)
	// A handle holds the message: delivered, not acknowledged, for 3 s on
	// end (its mint cannot finish).
	var (
		handles  []string
		held     time.Time
		state    jetstreamenv.ConsumerState
		deadline = time.Now().Add(3 * time.Minute)
	)
	for held.IsZero() || time.Since(held) < 3*time.Second {
		time.Sleep(250 * time.Millisecond)
		var err error
		state, _, err = jetstreamenv.MonitoredConsumer(ctx, in.monitor, "CI_RUNNER", "pod")
		handles = in.runningHandles(ctx, t)
		if err != nil || state.AckPending == 0 || len(handles) == 0 {
			held = time.Time{}
		} else if held.IsZero() {
			held = time.Now()
		}
		if time.Now().After(deadline) {
			in.dump(ctx, t)
			t.Fatal("no handle held the assignment 3 minutes after the push")
		}
	}
	select {
	case p := <-created:
		t.Fatalf("no fault: executor %s exists although its SVID could not be minted", p)
	default:
	}
	delivered := state.LastDelivered
	pids := map[string][]int{}
	for _, name := range handles {
		p, err := in.cs.CoreV1().Pods(installNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pids[name] = processesOfPod(t, string(p.UID), "handle"); len(pids[name]) == 0 {
			t.Fatalf("no handle process of Pod %s (UID %s) on the node", name, p.UID)
		}
	}
	for name, ps := range pids {
		for _, pid := range ps {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("SIGKILL %d (handle of %s): %v", pid, name, err)
			}
		}
	}
	killedAt := time.Now()
	// The kill landed: every process gone, the message still unacknowledged.
	for name, ps := range pids {
		for _, pid := range ps {
			for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("handle process %d of %s still there 10 s after SIGKILL", pid, name)
				}
			}
		}
	}
	if c, _, err := jetstreamenv.MonitoredConsumer(ctx, in.monitor, "CI_RUNNER", "pod"); err != nil || c.AckPending == 0 || c.Redelivered != state.Redelivered {
		t.Fatalf("no fault: after the kill the message is not held unacknowledged as before (%+v, %v; before %+v)", c, err, state)
	}
	t.Logf("assignment delivered at %v, held unacknowledged by %v (processes %v), its mint hanging; SIGKILLed %v after the delivery",
		delivered.Format(time.StampMilli), handles, pids, killedAt.Sub(delivered).Round(time.Millisecond))
	// SPIRE stays paused until the message has been delivered again, so the killed process
	// could not have finished its mint and created the executor itself.
	var again jetstreamenv.ConsumerState
	for deadline := time.Now().Add(killedAckWait + 2*time.Minute); ; time.Sleep(100 * time.Millisecond) {
		c, _, err := jetstreamenv.MonitoredConsumer(ctx, in.monitor, "CI_RUNNER", "pod")
		if err == nil && c.Redelivered > state.Redelivered {
			again = c
			break
		}
		if time.Now().After(deadline) {
			in.dump(ctx, t)
			t.Fatalf("the assignment not delivered again %v after the kill (%+v, %v)", time.Since(killedAt), c, err)
		}
	}
	// A crash costs AckWait from the delivery: a nak (a handle handing the message back as
	// SIGTERM lets it) brings it back at once.
	if gap := again.LastDelivered.Sub(delivered); gap < killedAckWait-time.Second {
		t.Fatalf("the assignment came back %v after its delivery, sooner than AckWait (%v): handed back, not lost with a crashed handle", gap, killedAckWait)
	} else {
		t.Logf("the assignment delivered again %v after its delivery (AckWait %v), %v after the kill", gap.Round(time.Millisecond), killedAckWait, again.LastDelivered.Sub(killedAt).Round(time.Millisecond))
	}
	resume()

	var executor string
	select {
	case executor = <-created:
	case <-time.After(3 * time.Minute):
		in.dump(ctx, t)
		t.Fatal("no executor Pod 3 minutes after the kill")
	}
	ep, err := in.cs.CoreV1().Pods(jobsNamespace).Get(ctx, executor, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ep.CreationTimestamp.Time.Before(killedAt.Truncate(time.Second)) {
		t.Fatalf("no fault: executor %s was created at %v, before the kill", executor, ep.CreationTimestamp)
	}
	assignment := ep.Labels["gitea-dynamic-runner.io/assignment-id"]
	acceptedBy := make(chan string, 1)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		for watchCtx.Err() == nil {
			if by := in.acceptedAfter(watchCtx, assignment, killedAt, handles); by != "" {
				acceptedBy <- by
				return
			}
			time.Sleep(time.Second)
		}
	}()
	job := in.waitCompleted(ctx, t, repo, "crash", 5*time.Minute)
	if job.Conclusion != "success" {
		t.Fatalf("job %+v, want success after its handle was killed", job)
	}
	if log := in.g.JobLogs(t, repo, job.ID); !strings.Contains(log, "ran in "+executor) {
		t.Fatalf("job crash's log does not show it ran in %s:\n%s", executor, log)
	}
	select {
	case second := <-created:
		t.Fatalf("a second executor Pod %s was created for the job", second)
	default:
	}
	// A handle that was not killed accepted the assignment after the kill.
	select {
	case by := <-acceptedBy:
		t.Logf("assignment %s delivered again and accepted by %s", assignment, by)
	case <-time.After(10 * time.Second):
		t.Fatalf("no handle but the killed ones accepted %s after the kill: the fault tested nothing", assignment)
	}
}

// setAckWait sets the pod consumer's AckWait as handle-setup would (its NATS user, with the
// shipped permissions alone; consumer info is read as handle's), and returns what puts the
// shipped configuration back.
func (in *installation) setAckWait(ctx context.Context, t *testing.T, ackWait time.Duration) func() {
	t.Helper()
	pod := in.nats.connect(t, "HANDLE_POD")
	c, err := pod.js.Consumer(ctx, "CI_RUNNER", "pod")
	if err != nil {
		t.Fatal(err)
	}
	pod.clean(t)
	shipped := c.CachedInfo().Config
	if shipped.AckWait != assignmentqueue.AckWait {
		t.Fatalf("the pod consumer's AckWait is %v, want the shipped %v", shipped.AckWait, assignmentqueue.AckWait)
	}
	setup := in.nats.connect(t, "HANDLE_SETUP")
	short := shipped
	short.AckWait = ackWait
	if _, err := setup.js.UpdateConsumer(ctx, "CI_RUNNER", short); err != nil {
		t.Fatalf("AckWait %v on the pod consumer: %v", ackWait, err)
	}
	setup.clean(t)
	return func() {
		if _, err := setup.js.UpdateConsumer(context.WithoutCancel(ctx), "CI_RUNNER", shipped); err != nil {
			t.Errorf("the pod consumer's AckWait back to %v: %v", shipped.AckWait, err)
		}
	}
}

// processesOfPod returns the PIDs on this machine (the test node's kubelet runs here) of the
// processes named comm in the Pod whose UID is uid, found by their cgroup (cgroupfs names it
// pod<uid>; systemd's driver pod<uid with underscores>).
func processesOfPod(t *testing.T, uid, comm string) []int {
	t.Helper()
	_, procs := nodeProcs(t)
	marks := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
	var pids []int
	for _, p := range procs {
		if name, err := p.Comm(); err != nil || name != comm {
			continue
		}
		groups, err := p.Cgroups()
		if err != nil {
			continue // gone
		}
		if slices.ContainsFunc(groups, func(g procfs.Cgroup) bool {
			return slices.ContainsFunc(marks, func(m string) bool { return strings.Contains(g.Path, m) })
		}) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}
