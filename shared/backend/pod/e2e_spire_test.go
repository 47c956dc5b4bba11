//go:build e2e

package pod

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// scheduled creates the executor of task taskID and schedules it to a Node
// that exists; it returns the executor as Find sees it.
func (env e2eEnv) scheduled(t *testing.T, b *Backend, taskID int64) (taskassignment.Assignment, *executor.Executor) {
	t.Helper()
	ctx := ctxT(t)
	a := testAssignment(t, taskID, "")
	e, err := b.Create(ctx, a, launch(env.keys, a))
	if err != nil {
		t.Fatal(err)
	}
	env.schedule(t, e.Name, env.ns+"-node", true)
	if e, err = b.Find(ctx, a.ID); err != nil || e == nil || e.IdentityTarget == "" {
		t.Fatalf("Find of a scheduled executor = %+v, %v", e, err)
	}
	return a, e
}

func TestE2EBindIdentity(t *testing.T) {
	env := newEnv(t)
	spire := spireenv.Start(t)
	ctx := ctxT(t)
	b := env.backend(t, spire.Entries())
	now := time.Unix(1_900_000_000, 0)
	b.now = func() time.Time { return now }
	a, e := env.scheduled(t, b, 1)

	// Binding twice is one entry.
	for i := 0; i < 2; i++ {
		if err := b.BindIdentity(ctx, e, a.Identity); err != nil {
			t.Fatalf("BindIdentity #%d: %v", i+1, err)
		}
	}
	entries := spire.AllEntries(t)
	if len(entries) != 1 {
		t.Fatalf("%d entries after binding twice, want 1", len(entries))
	}
	pod, err := env.client.CoreV1().Pods(env.ns).Get(ctx, e.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := entries[0]
	wantParent := "spiffe://ci.example.org/spire/agent/k8s_psat/test-cluster/" + e.IdentityTarget
	if got.Id != EntryID(DefaultEntryIDPrefix, a.ID) ||
		spiffeString(got.SpiffeId) != a.Identity.SPIFFEID ||
		spiffeString(got.ParentId) != wantParent ||
		!slices.Equal(selectorStrings(got.Selectors), []string{"k8s:ns:" + env.ns, "k8s:pod-uid:" + string(pod.UID)}) ||
		got.ExpiresAt != now.Add(90*time.Minute+DefaultExpiryMargin).Unix() {
		t.Fatalf("entry %v\nwant ID %s, SPIFFE ID %s, parent %s, selectors k8s:ns:%s and k8s:pod-uid:%s, expiry now+105m",
			got, EntryID(DefaultEntryIDPrefix, a.ID), a.Identity.SPIFFEID, wantParent, env.ns, pod.UID)
	}

	// Binding again later (a redelivery) keeps the entry as it is.
	now = now.Add(time.Hour)
	if err := b.BindIdentity(ctx, e, a.Identity); err != nil {
		t.Fatal(err)
	}
	if again := spire.AllEntries(t); len(again) != 1 || again[0].ExpiresAt != got.ExpiresAt {
		t.Fatalf("entries after a later bind: %v", again)
	}

	// An identity the Pod does not carry is refused before SPIRE is asked.
	otherID, err := taskidentity.New(env.td, "owner/other", "build", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.BindIdentity(ctx, e, otherID); err == nil || !strings.Contains(err.Error(), "carries SPIFFE ID") {
		t.Fatalf("binding another identity: %v", err)
	}
	// So is a stale executor (another node).
	stale := *e
	stale.IdentityTarget = "0000-other-node"
	if err := b.BindIdentity(ctx, &stale, a.Identity); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Fatalf("binding a stale executor: %v", err)
	}

	// Delete removes the entry; twice is fine.
	for i := 0; i < 2; i++ {
		if err := b.Delete(ctx, e); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if left := spire.AllEntries(t); len(left) != 0 {
		t.Fatalf("entries after Delete: %v", left)
	}
}

func TestE2EBindConflicts(t *testing.T) {
	env := newEnv(t)
	spire := spireenv.Start(t)
	ctx := ctxT(t)
	b := env.backend(t, spire.Entries())
	entries := spire.Entries()
	create := func(e *spiretypes.Entry) {
		t.Helper()
		resp, err := entries.BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*spiretypes.Entry{e}})
		if err != nil || codes.Code(resp.Results[0].Status.Code) != codes.OK {
			t.Fatalf("create entry %v: %v %v", e, resp, err)
		}
	}
	parentOf := func(e *executor.Executor) spiffeid.ID {
		p, err := agentID(env.td, "test-cluster", e.IdentityTarget)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("entry ID taken by another identity", func(t *testing.T) {
		a, e := env.scheduled(t, b, 1)
		other := spiffeid.RequireFromString("spiffe://ci.example.org/repo/someone/else/task/77")
		create(podEntry(EntryID(DefaultEntryIDPrefix, a.ID), other, parentOf(e), env.ns, "some-pod", 0))
		err := b.BindIdentity(ctx, e, a.Identity)
		if !errors.Is(err, ErrEntryConflict) {
			t.Fatalf("BindIdentity over a foreign entry: %v; want ErrEntryConflict", err)
		}
		got, gerr := entries.GetEntry(ctx, &entryv1.GetEntryRequest{Id: EntryID(DefaultEntryIDPrefix, a.ID)})
		if gerr != nil || spiffeString(got.SpiffeId) != other.String() {
			t.Fatalf("the foreign entry was touched: %v %v", got, gerr)
		}
	})

	t.Run("same identity bound by another ID", func(t *testing.T) {
		a, e := env.scheduled(t, b, 2)
		pod, err := env.client.CoreV1().Pods(env.ns).Get(ctx, e.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sid := spiffeid.RequireFromString(a.Identity.SPIFFEID)
		create(podEntry("someone-elses-entry", sid, parentOf(e), env.ns, string(pod.UID), 0))
		if err := b.BindIdentity(ctx, e, a.Identity); !errors.Is(err, ErrEntryConflict) || !strings.Contains(err.Error(), "someone-elses-entry") {
			t.Fatalf("BindIdentity with a similar entry under another ID: %v; want ErrEntryConflict naming it", err)
		}
	})

	t.Run("stale entry of an earlier Pod is replaced", func(t *testing.T) {
		a, e := env.scheduled(t, b, 3)
		sid := spiffeid.RequireFromString(a.Identity.SPIFFEID)
		create(podEntry(EntryID(DefaultEntryIDPrefix, a.ID), sid, parentOf(e), env.ns, "uid-of-an-earlier-pod", 0))
		if err := b.BindIdentity(ctx, e, a.Identity); err != nil {
			t.Fatal(err)
		}
		pod, err := env.client.CoreV1().Pods(env.ns).Get(ctx, e.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := entries.GetEntry(ctx, &entryv1.GetEntryRequest{Id: EntryID(DefaultEntryIDPrefix, a.ID)})
		if err != nil || !slices.Contains(selectorStrings(got.Selectors), "k8s:pod-uid:"+string(pod.UID)) || got.ExpiresAt == 0 {
			t.Fatalf("entry after the replacement: %v %v", got, err)
		}
	})

	t.Run("entry ID prefix", func(t *testing.T) {
		cfg := env.config(entries)
		cfg.EntryIDPrefix = "team-a.gdr_"
		pb, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		a, e := env.scheduled(t, pb, 4)
		if err := pb.BindIdentity(ctx, e, a.Identity); err != nil {
			t.Fatal(err)
		}
		id := EntryID("team-a.gdr_", a.ID)
		if _, err := entries.GetEntry(ctx, &entryv1.GetEntryRequest{Id: id}); err != nil {
			t.Fatalf("entry %s: %v", id, err)
		}
		if err := pb.Delete(ctx, e); err != nil {
			t.Fatal(err)
		}
		if _, err := entries.GetEntry(ctx, &entryv1.GetEntryRequest{Id: id}); err == nil {
			t.Fatalf("entry %s outlived Delete", id)
		}
	})
}
