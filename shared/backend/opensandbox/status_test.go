package opensandbox_test

import (
	"context"
	"testing"
)

// WaitReason names the sandbox's state as the server reports it, and
// nothing for an assignment without a sandbox.
func TestWaitReason(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if why, err := h.backend.WaitReason(ctx, "linux-1"); why != "" || err != nil {
		t.Fatalf("no sandbox: %q, %v", why, err)
	}
	a := assignment(t, "linux", 1)
	created := h.create(t, a)
	h.fake.SetState(created.Name, "Allocated")
	if why, err := h.backend.WaitReason(ctx, a.ID); why != "sandbox Allocated: test_transition" || err != nil {
		t.Fatalf("allocated: %q, %v", why, err)
	}
}
