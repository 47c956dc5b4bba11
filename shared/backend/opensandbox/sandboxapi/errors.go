package sandboxapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// APIError is a non-2xx answer of the server, whatever its status (422
// included). It carries what the server said about the failure and never
// anything of the request: no body, no environment value, no API key.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Code is the ErrorResponse code (such as SANDBOX::INVALID_METADATA_LABEL),
	// empty when the body had none (a 422, a proxy's page).
	Code string
	// Message is the server's explanation: the ErrorResponse message, or the
	// locations and messages of a 422's details (never their input values).
	Message string
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP %d", e.Status)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// IsNotFound reports whether err is (or wraps) a 404 answer.
func IsNotFound(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// Retryable reports whether a request that failed with err may succeed when
// sent again: a 429, a 500, 502, 503 or 504 answer, or a failure to get an
// answer at all (transport, an unreadable answer). A request this package
// refused to send, another status and a cancelled or expired context are not
// retryable. A non-idempotent request (a create) that failed in a retryable
// way may still have taken effect.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var e *APIError
	if errors.As(err, &e) {
		switch e.Status {
		case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
			http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
		return false
	}
	var local *localError
	return !errors.As(err, &local)
}

// localError is a request this package refused to send (invalid metadata, a
// missing field): sending it again cannot help.
type localError struct{ msg string }

func (e *localError) Error() string { return e.msg }

func invalid(format string, args ...any) error {
	return &localError{msg: fmt.Sprintf(format, args...)}
}

// maxMessage bounds the message kept from an error body.
const maxMessage = 512

// apiError builds the error of a non-2xx answer from its status and body.
// Only the ErrorResponse fields and, of a FastAPI 422, each detail's location
// and message are kept: a detail's "input" echoes the request and is dropped.
func apiError(status int, body []byte) *APIError {
	e := &APIError{Status: status}
	var parsed struct {
		Code    any             `json:"code"`
		Message any             `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &parsed) != nil {
		e.Message = http.StatusText(status)
		return e
	}
	if s, ok := parsed.Code.(string); ok {
		e.Code = s
	}
	if s, ok := parsed.Message.(string); ok {
		e.Message = s
	}
	if e.Message == "" && len(parsed.Detail) > 0 {
		e.Message = detailMessage(parsed.Detail)
	}
	if e.Message == "" {
		e.Message = http.StatusText(status)
	}
	if len(e.Message) > maxMessage {
		e.Message = e.Message[:maxMessage] + "..."
	}
	return e
}

// detailMessage renders a FastAPI "detail": a string, or a list of
// {loc, msg} objects as "loc: msg; ...".
func detailMessage(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var items []struct {
		Loc []any  `json:"loc"`
		Msg string `json:"msg"`
	}
	if json.Unmarshal(raw, &items) != nil {
		return ""
	}
	parts := make([]string, 0, len(items))
	for _, it := range items {
		loc := make([]string, 0, len(it.Loc))
		for _, l := range it.Loc {
			loc = append(loc, fmt.Sprint(l))
		}
		parts = append(parts, strings.Join(loc, ".")+": "+it.Msg)
	}
	return strings.Join(parts, "; ")
}
