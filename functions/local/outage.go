package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
)

// giteaBackoff caps the wait between dispatch rounds while they fail
// (dispatcher.Cadence.Backoff): Gitea is asked again at most this long
// after it answers again, unless a webhook or a freed slot asks sooner.
const giteaBackoff = 30 * time.Second

// outage tells a person at a terminal when the dispatch rounds start to
// fail and when they work again, once each: a warning as a failure starts
// (Gitea unreachable, or another cause), an info line as Gitea answers
// again, and the failures in between at debug level, however many rounds
// ask (Gitea's outages back off, but a restart of it would still be dozens
// of lines).
//
// Invariants: a warning is said only on a change of cause; "answers again"
// only after a warning; safe for concurrent use.
type outage struct {
	log *slog.Logger
	url string
	// now is the clock; nil is time.Now.
	now func() time.Time

	mu    sync.Mutex
	cause string    // "" while nothing fails
	since time.Time // when cause started
}

// causeUnreachable is the cause of failures that are Gitea not answering.
const causeUnreachable = "Gitea unreachable"

// unreachable reports whether err is Gitea (or the network to it) not
// answering, as opposed to an answer refusing the call.
func unreachable(err error) bool {
	var e *gitea.Error
	return errors.As(err, &e) && e.Retryable()
}

func (o *outage) clock() time.Time {
	if o.now == nil {
		return time.Now()
	}
	return o.now()
}

// failed says that what failed with err: a warning when its cause is new,
// debug otherwise.
func (o *outage) failed(ctx context.Context, what string, err error) {
	cause := what + " failed"
	if unreachable(err) {
		cause = causeUnreachable
	}
	o.mu.Lock()
	fresh := cause != o.cause
	if fresh {
		o.cause, o.since = cause, o.clock()
	}
	o.mu.Unlock()
	if !fresh {
		o.log.DebugContext(ctx, cause+", again", slog.String("what", what), slog.Any("error", err))
		return
	}
	msg := cause + "; retrying less and less often, at most every " + giteaBackoff.String()
	o.log.WarnContext(ctx, msg, slog.String("gitea", o.url), slog.Any("error", err))
}

// unreachableOnly is failed for what fails for other reasons too and is
// said by its own warning (recover's pass): only Gitea not answering goes
// to the outage; false means err is for the caller to say.
func (o *outage) unreachableOnly(ctx context.Context, what string, err error) bool {
	if !unreachable(err) {
		return false
	}
	o.failed(ctx, what, err)
	return true
}

// answered says that a dispatch round worked: when one had failed, that
// Gitea answers again, with how long it did not.
func (o *outage) answered(ctx context.Context) {
	o.mu.Lock()
	cause, since := o.cause, o.since
	o.cause = ""
	o.mu.Unlock()
	if cause == "" {
		return
	}
	o.log.InfoContext(ctx, "Gitea answers again", slog.String("gitea", o.url),
		slog.String("after", o.clock().Sub(since).Round(100*time.Millisecond).String()), slog.String("was", cause))
}

// internals is a handler that writes its info lines at debug level: what
// the cores say of each assignment, round and pass (local mode's INFO is
// one line per job event, jobEvents, and its own start and stop); their
// warnings and errors stay what they are.
type internals struct{ slog.Handler }

func demote(l slog.Level) slog.Level {
	if l == slog.LevelInfo {
		return slog.LevelDebug
	}
	return l
}

func (h internals) Enabled(ctx context.Context, l slog.Level) bool {
	return h.Handler.Enabled(ctx, demote(l))
}

func (h internals) Handle(ctx context.Context, r slog.Record) error {
	r.Level = demote(r.Level)
	return h.Handler.Handle(ctx, r)
}

func (h internals) WithAttrs(attrs []slog.Attr) slog.Handler {
	return internals{h.Handler.WithAttrs(attrs)}
}

func (h internals) WithGroup(name string) slog.Handler { return internals{h.Handler.WithGroup(name)} }
