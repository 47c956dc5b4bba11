package gitea

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"

	"connectrpc.com/connect"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Error is a failed runner-protocol call.
type Error struct {
	// Op is the RPC: Register, Declare, FetchTask, UpdateTask or UpdateLog.
	Op string
	// Code is the real code: for an answer from Gitea, the gRPC code inside
	// its message (Gitea's errors all reach a Connect client as "unknown");
	// for a transport failure, the Connect code.
	Code connect.Code
	// Message is Gitea's description, or the transport error's.
	Message string
	err     error
}

func (e *Error) Error() string { return fmt.Sprintf("gitea %s: %s: %s", e.Op, e.Code, e.Message) }

func (e *Error) Unwrap() error { return e.err }

// Retryable reports whether the same call may succeed later unchanged: the
// server or the network was unavailable, overloaded or too slow.
func (e *Error) Retryable() bool {
	switch e.Code {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeResourceExhausted, connect.CodeAborted:
		return true
	}
	return false
}

// Is reports whether e means target: taskassignment.ErrTaskGone for an answer that says the
// task is gone (errors.Is uses it).
func (e *Error) Is(target error) bool {
	if target != taskassignment.ErrTaskGone || (e.Op != "UpdateTask" && e.Op != "UpdateLog") {
		return false
	}
	switch e.Code {
	case connect.CodeNotFound:
		return true
	case connect.CodeInternal:
		return strings.HasSuffix(e.Message, giteaNotExist) || strings.Contains(e.Message, giteaInvalidRunner)
	}
	return false
}

// Gitea's texts of a missing task (util.ErrNotExist) and of another runner's.
const (
	giteaNotExist      = "resource does not exist"
	giteaInvalidRunner = "invalid runner for task"
)

// CodeOf returns the code of a runner-protocol error (connect.CodeUnknown for
// an error from elsewhere, 0 for nil).
func CodeOf(err error) connect.Code {
	if err == nil {
		return 0
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return connect.CodeUnknown
}

// grpcStatus matches Gitea's "rpc error: code = <Code> desc = <text>".
var grpcStatus = regexp.MustCompile(`rpc error: code = ([A-Za-z]+) desc = (.*)`)

// classify turns a Connect error of a call made with ctx into an *Error with the real
// code. A nil error stays nil.
//
// A call Gitea cancels (its shutdown cancels the requests in flight, answered "canceled")
// while ctx is not done is Gitea going away: CodeUnavailable, retryable like the refused
// connections that follow, not a refusal of the call. A call ctx canceled stays canceled.
func classify(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	e := &Error{Op: op, Code: connect.CodeOf(err), Message: err.Error(), err: err}
	var ce *connect.Error
	if errors.As(err, &ce) {
		e.Message = ce.Message()
	}
	if e.Code == connect.CodeCanceled && ctx.Err() == nil {
		e.Code = connect.CodeUnavailable
		e.Message = "Gitea ended the call before answering (stopping or restarting?): " + e.Message
		return e
	}
	if m := grpcStatus.FindStringSubmatch(e.Message); m != nil {
		var code connect.Code
		if code.UnmarshalText([]byte(snake(m[1]))) == nil {
			e.Code = code
			e.Message = m[2]
		}
	}
	return e
}

// snake turns a gRPC code name (AlreadyExists) into Connect's (already_exists).
func snake(name string) string {
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
