package pod

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

// uidOnCreate makes the fake clientset give each created Pod a UID, as the
// API server does.
func uidOnCreate(client *fake.Clientset) {
	n := 0
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n++
		a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).UID = ktypes.UID("pod-uid-" + string(rune('0'+n)))
		return false, nil, nil
	})
}

// With a Minter, Create puts an SVID for exactly the task's identity into
// the Pod's Secret, valid for the Pod's life; the Pod mounts no Workload
// API; the executor is bound to its Pod at once, without any SPIRE entry
// (nopEntries fails every call); a redelivery keeps the SVID the runner may
// already hold.
func TestCreateMintsTheSVIDIntoTheSecret(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	client := fake.NewClientset()
	uidOnCreate(client)
	ca, err := svidca.New(cfg.TrustDomain)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client, cfg.Minter = client, ca
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := testAssignment(t, 7, "")
	before := time.Now()
	e, err := b.Create(ctx, a, launch(cfg.Keys, a))
	if err != nil {
		t.Fatal(err)
	}
	pod, err := client.CoreV1().Pods("ci").Get(ctx, "gdr-linux-7", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if e.IdentityTarget != string(pod.UID) || pod.UID == "" {
		t.Fatalf("identity target %q, want the Pod's UID %q", e.IdentityTarget, pod.UID)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == workloadAPIVolume || v.CSI != nil || v.HostPath != nil {
			t.Fatalf("a Pod with a minted SVID mounts the Workload API: %+v", v)
		}
	}
	for _, env := range pod.Spec.Containers[0].Env {
		if env.Name == EnvWorkloadAPISocket {
			t.Fatalf("the runner container names a Workload API socket: %+v", env)
		}
	}
	secret, err := client.CoreV1().Secrets("ci").Get(ctx, SecretName(pod.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svid, err := x509svid.Parse(secret.Data[bootstrap.EnvSVIDCert], secret.Data[bootstrap.EnvSVIDKey])
	if err != nil {
		t.Fatalf("the Secret's SVID: %v", err)
	}
	if svid.ID.String() != a.Identity.SPIFFEID {
		t.Fatalf("SVID of %s, want %s", svid.ID, a.Identity.SPIFFEID)
	}
	bundle, err := x509bundle.Parse(cfg.TrustDomain, secret.Data[bootstrap.EnvSVIDBundle])
	if err != nil || !bundle.Equal(ca.Bundle()) {
		t.Fatalf("the Secret's bundle is not the minter's: %v", err)
	}
	// The Pod lives its pool's 90 minutes at most; the SVID that long and
	// the margin, no longer.
	notAfter := svid.Certificates[0].NotAfter
	if lo, hi := before.Add(90*time.Minute), time.Now().Add(90*time.Minute+DefaultExpiryMargin); notAfter.Before(lo) || notAfter.After(hi) {
		t.Fatalf("SVID ends %v, want within [%v, %v]", notAfter, lo, hi)
	}
	if err := b.BindIdentity(ctx, e, a.Identity); err != nil {
		t.Fatalf("BindIdentity of a Pod with its minted SVID: %v", err)
	}

	// A redelivery mints again but keeps the SVID the Secret holds.
	if _, err := b.Create(ctx, a, launch(cfg.Keys, a)); err != nil {
		t.Fatal(err)
	}
	again, err := client.CoreV1().Secrets("ci").Get(ctx, SecretName(pod.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(again.Data[bootstrap.EnvSVIDCert]) != string(secret.Data[bootstrap.EnvSVIDCert]) {
		t.Fatal("a second Create replaced the SVID in the Secret")
	}

	// An executor that names an earlier Pod of the assignment is stale.
	stale := *e
	stale.IdentityTarget = "an-earlier-pod"
	if err := b.BindIdentity(ctx, &stale, a.Identity); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Fatalf("BindIdentity of a stale executor: %v", err)
	}
	// A Pod whose Secret is gone holds no identity of ours.
	if err := client.CoreV1().Secrets("ci").Delete(ctx, SecretName(pod.Name), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.BindIdentity(ctx, e, a.Identity); err == nil || !strings.Contains(err.Error(), "no Secret") {
		t.Fatalf("BindIdentity of a Pod without its Secret: %v", err)
	}
}

type failingMinter struct{ calls int }

func (f *failingMinter) MintX509SVID(context.Context, spiffeid.ID, time.Duration) (*x509svid.SVID, *x509bundle.Bundle, error) {
	f.calls++
	return nil, nil, errors.New("spire-server unavailable")
}

// A mint that fails fails Create before any Pod exists, transiently.
func TestCreateMintFailureLeavesNothing(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	client := fake.NewClientset()
	m := &failingMinter{}
	cfg.Client, cfg.Minter = client, m
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := testAssignment(t, 8, "")
	_, err = b.Create(ctx, a, launch(cfg.Keys, a))
	if m.calls != 1 {
		t.Fatalf("the minter was called %d times, want 1", m.calls)
	}
	if err == nil || !strings.Contains(err.Error(), "spire-server unavailable") || executor.IsPermanent(err) {
		t.Fatalf("Create with a failing minter: %v; want a transient error naming the cause", err)
	}
	if _, err := client.CoreV1().Pods("ci").Get(ctx, b.PodName(a.ID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a Pod exists after a failed mint: %v", err)
	}
}

// With runnerInImage, a job in the pool's own image runs the runner the
// image holds: no install init container, no runner volume; a job in its own
// image (container:) still gets the runner installed. Either way, with a
// Minter, no Workload API.
func TestCreateRunsTheRunnerTheImageHolds(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	client := fake.NewClientset()
	ca, err := svidca.New(cfg.TrustDomain)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client, cfg.Minter = client, ca
	cfg.Pools[0].Profile = []byte(`{"runnerInImage":"/usr/local/bin/runner",` + testTemplate[1:])
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		task    int64
		image   string
		install bool
		command string
	}{
		{1, "", false, "/usr/local/bin/runner"},
		{2, "node:22", true, RunnerPath},
	} {
		a := testAssignment(t, tc.task, tc.image)
		if _, err := b.Create(ctx, a, launch(cfg.Keys, a)); err != nil {
			t.Fatal(err)
		}
		pod, err := client.CoreV1().Pods("ci").Get(ctx, b.PodName(a.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := pod.Spec.Containers[runnerIndex(pod.Spec.Containers)]
		hasInstall := len(pod.Spec.InitContainers) == 1 && pod.Spec.InitContainers[0].Name == InstallContainer
		if hasInstall != tc.install || (!tc.install && len(pod.Spec.InitContainers) != 0) {
			t.Errorf("task %d (image %q): init containers %+v, want the install container: %v", tc.task, tc.image, pod.Spec.InitContainers, tc.install)
		}
		if len(c.Command) != 1 || c.Command[0] != tc.command {
			t.Errorf("task %d: runner command %q, want %s", tc.task, c.Command, tc.command)
		}
		var volumes []string
		for _, v := range pod.Spec.Volumes {
			volumes = append(volumes, v.Name)
		}
		if want := map[bool]int{true: 1, false: 0}[tc.install]; len(volumes) != want || (want == 1 && volumes[0] != runnerVolume) {
			t.Errorf("task %d: volumes %v, want the runner volume: %v", tc.task, volumes, tc.install)
		}
	}
}

// With the installation's CA (GDR_POD_IDENTITY=ca) there is no SPIRE: no entry client at all.
// Create mints from the CA's folder into the Pod's Secret, with the folder's rotation bundle,
// and Delete removes Pod and Secret without asking for an entry.
func TestCAIdentityNeedsNoSPIRE(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	client := fake.NewClientset()
	uidOnCreate(client)
	dir := t.TempDir()
	if _, err := svidca.LoadOrCreate(dir, cfg.TrustDomain); err != nil {
		t.Fatal(err)
	}
	cfg.Client, cfg.Entries, cfg.Minter = client, nil, svidca.NewDeferred(dir, cfg.TrustDomain)
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := testAssignment(t, 7, "")
	e, err := b.Create(ctx, a, launch(cfg.Keys, a))
	if err != nil {
		t.Fatal(err)
	}
	secret, err := client.CoreV1().Secrets("ci").Get(ctx, SecretName(e.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svid, err := x509svid.Parse(secret.Data[bootstrap.EnvSVIDCert], secret.Data[bootstrap.EnvSVIDKey])
	if err != nil {
		t.Fatal(err)
	}
	want, err := spiffeid.FromString(a.Identity.SPIFFEID)
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID != want {
		t.Fatalf("the Secret's SVID is %s, want %s", svid.ID, want)
	}
	if err := b.Delete(ctx, e); err != nil {
		t.Fatalf("Delete without SPIRE: %v", err)
	}
	if _, err := client.CoreV1().Pods("ci").Get(ctx, e.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the Pod after Delete: %v", err)
	}
	cfg.Minter = nil
	if _, err := New(cfg); err == nil {
		t.Fatal("a backend with neither an entry client nor a minter was built")
	}
}
