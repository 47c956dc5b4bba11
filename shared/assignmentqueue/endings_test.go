package assignmentqueue_test

import (
	"slices"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
)

// An end mark outlives the payload's Delete (it is what a later redelivery
// is checked against), is never listed as a payload (it would count against
// a pool's capacity and look like an orphan), and reads the same through
// OpenEndings, which holds no payload key.
func TestEndings(t *testing.T) {
	ctx, js, p, _ := newPayloads(t, testKey(1))
	for _, id := range []string{"pool-a-1", "pool-a-2"} {
		if err := p.Put(ctx, id, testTask(t, 1)); err != nil {
			t.Fatal(err)
		}
	}
	e := p.Endings()
	if err := e.MarkEnded(ctx, "pool-a-1"); err != nil {
		t.Fatal(err)
	}
	if err := e.MarkEnded(ctx, "pool-a-1"); err != nil { // twice: harmless
		t.Fatal(err)
	}
	if err := p.Delete(ctx, "pool-a-1"); err != nil {
		t.Fatal(err)
	}
	ids, err := p.IDs(ctx)
	if err != nil || !slices.Equal(ids, []string{"pool-a-2"}) {
		t.Fatalf("IDs = %v, %v; want only the payload left, no mark", ids, err)
	}
	opened, err := assignmentqueue.OpenEndings(ctx, js, testBucket)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"pool-a-1": true, "pool-a-2": false, "pool-b-9": false} {
		for _, r := range []*assignmentqueue.Endings{e, opened} {
			if got, err := r.Ended(ctx, id); err != nil || got != want {
				t.Errorf("Ended(%s) = %v, %v; want %v", id, got, err, want)
			}
		}
	}
	if err := e.MarkEnded(ctx, ""); err == nil {
		t.Error("MarkEnded of an empty ID succeeded")
	}
	if _, err := assignmentqueue.OpenEndings(ctx, js, "NO_SUCH_BUCKET"); err == nil {
		t.Error("OpenEndings of a missing bucket succeeded")
	}
}
