package executor

import "errors"

// permanentError marks an error that no retry can fix: the same call with the
// same assignment fails the same way until a person changes something (an
// invalid spec, a pool this backend is not configured for, a runner binary
// that does not exist). It wraps the cause, so errors.Is and errors.As see
// through it.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: the assignment can never be accepted, so
// the task is failed in Gitea with err's text as the reason and its message
// is not delivered again. The text reaches the job's log: it must say why in
// words a user can act on and never carry a credential. Permanent(nil) is
// nil.
//
// Only a backend knows which of its errors are permanent; anything it does
// not mark (a timeout, a 5xx, a refusal an operator can fix, such as missing
// RBAC) is retried with backoff.
func Permanent(err error) error {
	if err == nil || IsPermanent(err) {
		return err
	}
	return permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was marked by
// Permanent. Wrapping a permanent error with fmt.Errorf("...: %w", err) keeps
// it permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}
