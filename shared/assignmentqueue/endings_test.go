package assignmentqueue_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
)

// An end mark outlives the payload's Delete (it is what a later redelivery
// is checked against), lives in a bucket of its own (so it is never listed as
// a payload, and handle's grant reaches no payload), and reads the same
// through OpenEndings.
func TestEndings(t *testing.T) {
	ctx, js, p, _ := newPayloads(t, testKey(1))
	for _, id := range []string{"pool-a-1", "pool-a-2"} {
		if err := p.Put(ctx, id, testTask(t, 1)); err != nil {
			t.Fatal(err)
		}
	}
	ended := assignmentqueue.EndingsBucket(testBucket)
	e, err := assignmentqueue.EnsureEndings(ctx, js, assignmentqueue.Bucket{Name: ended, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
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
	opened, err := assignmentqueue.OpenEndings(ctx, js, ended)
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
	if ended != testBucket+"_ENDED" {
		t.Errorf("EndingsBucket(%s) = %s", testBucket, ended)
	}
}

// A listing cut short (its connection closed under it) is an error, never a
// short list: dispatch counts a pool's tasks in flight from it, and a short
// count would let it claim past the pool's capacity.
func TestPayloadIDsCutShortIsAnError(t *testing.T) {
	// Its own budget: 3,000 keys published and listed 11 times under the race
	// detector passed testContext's 20 s once on a loaded 2-core machine
	// (nothing here is timed).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, url := jetstreamenv.Start(t)
	_, js := jetstreamenv.Connect(t, url)
	p, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour}, testKey(1))
	if err != nil {
		t.Fatal(err)
	}
	const keys = 3000
	for i := range keys {
		if _, err := js.PublishAsync(fmt.Sprintf("$KV.%s.pool-%d", testBucket, i), []byte{1}); err != nil {
			t.Fatal(err)
		}
		if (i+1)%500 == 0 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	for round := range 10 {
		nc, js2 := jetstreamenv.Connect(t, url)
		p2, err := assignmentqueue.OpenPayloads(ctx, js2, testBucket, testKey(1))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(time.Duration(round) * time.Millisecond)
			nc.Close()
		}()
		ids, err := p2.IDs(ctx)
		if err == nil && len(ids) != keys {
			t.Fatalf("round %d: IDs listed %d of %d keys without an error", round, len(ids), keys)
		}
	}
	if ids, err := p.IDs(ctx); err != nil || len(ids) != keys {
		t.Fatalf("IDs on a healthy connection = %d keys, %v", len(ids), err)
	}
}
