package main

import (
	"context"
	"sync"
)

// exits finishes executors as their processes end, so that a finished job is
// reported, cleaned up and its capacity slot freed at once, not on recover's
// next tick.
//
// exited (the process backend's OnExit) never blocks: it queues the
// assignment ID, once however often it comes, and wakes run. run, one
// goroutine, hands the queued IDs to finish one after another, and calls
// after for each that freed a slot (local mode: wake the dispatch loop,
// which coalesces wake-ups, to use the slot). So there is one goroutine
// whatever the number of exits, and the queue holds at most the executors
// that ended and were not yet finished.
//
// Nothing here is durable, and nothing needs to be: an exit that is never
// finished (local mode restarted before it, or the executor was started by
// an earlier process whose reaper died with it, or finish failed) leaves the
// executor as it was, and recover's periodic pass finishes it.
type exits struct {
	// finish handles one ended executor; true means its slot is free.
	finish func(ctx context.Context, assignmentID string) (freed bool)
	// after runs each time finish freed a slot; it must not block.
	after func()

	mu     sync.Mutex
	queue  []string
	queued map[string]bool
	wake   chan struct{}
}

func newExits(finish func(context.Context, string) bool, after func()) *exits {
	return &exits{finish: finish, after: after, queued: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// exited queues an ended executor's assignment ID; it never blocks.
func (x *exits) exited(assignmentID string) {
	x.mu.Lock()
	if !x.queued[assignmentID] {
		x.queued[assignmentID] = true
		x.queue = append(x.queue, assignmentID)
	}
	x.mu.Unlock()
	select {
	case x.wake <- struct{}{}:
	default: // run is already woken
	}
}

// run finishes queued exits until ctx ends.
func (x *exits) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-x.wake:
		}
		for _, id := range x.take() {
			if ctx.Err() != nil {
				return
			}
			if x.finish(ctx, id) {
				x.after()
			}
		}
	}
}

// take empties the queue and returns what it held, oldest first.
func (x *exits) take() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	ids := x.queue
	x.queue = nil
	clear(x.queued)
	return ids
}
