package taskassignment

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// What handle, recover and the queue agree on about an assignment's
// delivery and its end: how often a message is delivered, the wire format of
// the reason a rejected message carries (from handle, through the server's
// advisory, to recover and the job's log), what a finish notice holds, and
// the facts the cores act on whatever transport reports them. The cores see
// them here, never in a transport's package.

const (
	// MaxDeliver bounds the deliveries of one assignment message. A message
	// delivered this many times without an ack is no longer delivered but
	// stays in the stream; handle terminates a message on its last delivery
	// instead of handing it back (ExhaustedReason).
	MaxDeliver = 1000
	// FinishedMaxDeliver bounds the deliveries of one notice: an executor
	// still exiting after that many retries is left to recover's pass. The
	// receiver terminates a notice on its last delivery rather than nak it
	// (a work-queue message past MaxDeliver would stay in the stream).
	FinishedMaxDeliver = 5

	// MaxReasonBytes caps the explanation RejectedReason carries: it goes
	// into an advisory and the job's log, not a novel.
	MaxReasonBytes = 512

	reasonPermanent = "permanent"
	reasonExhausted = "exhausted"

	// maxNoticeBytes is more than any assignment ID (a label value, at
	// most 63 bytes): a longer body is refused unread, and never logged.
	maxNoticeBytes = 256
)

var (
	// ErrPayloadNotFound means no payload is stored under the assignment ID:
	// it was never put, was deleted, or outlived the bucket's TTL.
	ErrPayloadNotFound = errors.New("task payload not found")
)

// ErrTaskGone is what errors.Is finds in an answer about one task (UpdateTask,
// UpdateLog) saying Gitea has no such task for this registration, for good:
// the task does not exist (deleted with its run or repository; Gitea answers
// Internal "... resource does not exist", its 404 error, or NotFound), or
// another runner holds it (Internal "invalid runner for task"). No later call
// about that task can succeed, unlike an unavailable Gitea or an unregistered
// runner, which are not task facts.
var ErrTaskGone = errors.New("task gone from Gitea")

// ErrNotAnAssignment: a message of the queue that does not authenticate or
// decode.
var ErrNotAnAssignment = errors.New("not an authentic assignment")

// RejectedReason is the termination reason of an assignment handle can
// never accept: "permanent <assignment ID>: <why>", why on one line and at
// most MaxReasonBytes long. why must not carry a credential (error texts in
// this codebase never do): it reaches the job's log.
func RejectedReason(assignmentID, why string) string {
	return reasonPermanent + " " + assignmentID + ": " + oneLine(why, MaxReasonBytes)
}

// ExhaustedReason is the termination reason of a message handed back on its
// last delivery: "exhausted <assignment ID>: deliveries exhausted", or
// "deliveries exhausted" when the message did not decode to an assignment.
func ExhaustedReason(assignmentID string) string {
	if assignmentID == "" {
		return "deliveries exhausted"
	}
	return reasonExhausted + " " + assignmentID + ": deliveries exhausted"
}

// oneLine joins s's lines with "; " and cuts it to at most n bytes, on a
// rune boundary.
func oneLine(s string, n int) string {
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	s = strings.Join(lines, "; ")
	if len(s) <= n {
		return s
	}
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// RejectionKind is what a captured advisory says happened.
type RejectionKind string

const (
	// Terminated: handle terminated the message, with a reason.
	Terminated RejectionKind = "terminated"
	// MaxDeliveries: the message reached MaxDeliver without a termination;
	// it is still in the queue's stream (QueueSeq).
	MaxDeliveries RejectionKind = "max_deliveries"
)

// Rejection is one entry of the capture stream.
type Rejection struct {
	// Seq is the entry's sequence in the capture stream (RemoveRejection).
	Seq  uint64
	Kind RejectionKind
	// Consumer is the consumer the message was delivered by: the backend.
	Consumer string
	// QueueSeq is the message's sequence in the queue's stream.
	QueueSeq   uint64
	Deliveries uint64
	// Reason is the termination reason as handle gave it (Terminated only).
	Reason string
	// Err says why the entry did not decode; the other fields but Seq are
	// then unset. Such an entry is not for recover to act on.
	Err error
}

// Cause parses a Terminated rejection's reason: the assignment ID and why it
// was rejected (RejectedReason), or that its deliveries were exhausted
// (ExhaustedReason: exhausted true). ok is false for any other reason
// (poison, a reason without an ID, a forgery that does not parse).
func (r Rejection) Cause() (assignmentID, why string, exhausted, ok bool) {
	if r.Kind != Terminated {
		return "", "", false, false
	}
	kind, rest, found := strings.Cut(r.Reason, " ")
	if !found || (kind != reasonPermanent && kind != reasonExhausted) {
		return "", "", false, false
	}
	id, why, found := strings.Cut(rest, ": ")
	if !found {
		return "", "", false, false
	}
	if _, _, err := ParseID(id); err != nil {
		return "", "", false, false
	}
	return id, why, kind == reasonExhausted, true
}

// FinishedNotice returns the assignment ID a finish notice's body names, or
// an error when it names none (the caller terminates such a notice).
func FinishedNotice(body []byte) (string, error) {
	if len(body) > maxNoticeBytes {
		return "", fmt.Errorf("finish notice: %d bytes, longer than any assignment ID", len(body))
	}
	id := string(body)
	if _, _, err := ParseID(id); err != nil {
		return "", fmt.Errorf("finish notice: %w", err)
	}
	return id, nil
}

// NoticeOutcome is the fate of one finish notice.
type NoticeOutcome int

const (
	// NoticeFinished: the executor was reported (or Gitea had ended the
	// task) and deleted, and its payload deleted; acknowledge.
	NoticeFinished NoticeOutcome = iota
	// NoticeAbsent: no executor, nothing to do; acknowledge.
	NoticeAbsent
	// NoticeRetry: the executor has not ended yet, Finish failed, or the
	// run is shutting down; offer the notice again after RetryAfter.
	NoticeRetry
	// NoticeDropped: the notice is malformed or names no assignment of a
	// pool of this backend; drop it with Reason.
	NoticeDropped
)

// NoticeDecision is what recover's finish mode made of one finish notice,
// for its adapter to carry out.
type NoticeDecision struct {
	// Assignment is the notice's assignment ID; empty when malformed.
	Assignment string
	Outcome    NoticeOutcome
	// RetryAfter: NoticeRetry only, counted from the decision (zero when
	// shutting down: at once, for another run).
	RetryAfter time.Duration
	// Reason: NoticeDropped only.
	Reason string
	// Err is why the notice is retried or dropped, when there is an error.
	Err error
}

// DeadLetterOutcome is what DeadLetter made of an assignment the Knative
// path gave up on.
type DeadLetterOutcome int

const (
	// DeadLetterFailed: the task was reported failed with the reason, its
	// executor (none, normally) and payload deleted.
	DeadLetterFailed DeadLetterOutcome = iota
	// DeadLetterHeld: an executor has taken the assignment (its runner
	// fetched the task, or it runs or has ended): the pass owns its end;
	// nothing was failed.
	DeadLetterHeld
	// DeadLetterLeft: the assignment's pool is not configured here, or its
	// backend is not the pool's; nothing was done.
	DeadLetterLeft
)

func (o DeadLetterOutcome) String() string {
	switch o {
	case DeadLetterFailed:
		return "failed"
	case DeadLetterHeld:
		return "held"
	case DeadLetterLeft:
		return "left"
	}
	return "unknown"
}
