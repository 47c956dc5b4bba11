// Package handlertest holds the fixtures of handle's tests: assignments
// signed as dispatch signs them (with jetstreamenv's signer), forged ones,
// and a worker over a test backend. The core's tests (shared/handler) and
// its adapters' (shared/trigger/pull, shared/trigger/push) share them.
package handlertest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentsig"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// TrustDomain is the fixtures' trust domain.
var TrustDomain = spiffeid.RequireTrustDomainFromString("ci.example.org")

// Assignment is task taskID's assignment to the process backend's pool
// linux, of repository alice/repo's job build.
func Assignment(t testing.TB, taskID int64) taskassignment.Assignment {
	t.Helper()
	id, err := taskidentity.New(TrustDomain, "alice/repo", "build", taskID)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendProcess, taskassignment.Task{ID: taskID, Pool: "linux"}, id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Worker is an executor.Worker of backend with a bootstrap and keys of the
// trust domain.
func Worker(t testing.TB, backend executor.Backend) executor.Worker {
	t.Helper()
	b, err := bootstrap.New(bytes.Repeat([]byte{9}, 32), "https://gateway.example.org", spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := taskassignment.NewKeys("ci.example.org")
	if err != nil {
		t.Fatal(err)
	}
	return executor.Worker{Backend: backend, Bootstrap: b, Keys: keys}
}

// AcceptFunc adapts a function to handler.Acceptor.
type AcceptFunc func(context.Context, taskassignment.Assignment) (bool, error)

func (f AcceptFunc) Accept(ctx context.Context, a taskassignment.Assignment) (bool, error) {
	return f(ctx, a)
}

// Encode returns a's message as dispatch publishes it: signed.
func Encode(t testing.TB, a taskassignment.Assignment) []byte {
	t.Helper()
	return Seal(t, jetstreamenv.Signer(), Raw(t, a))
}

// Raw returns a's message unsigned.
func Raw(t testing.TB, a taskassignment.Assignment) []byte {
	t.Helper()
	data, err := taskassignment.Encode(a)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Seal signs msg with s.
func Seal(t testing.TB, s *assignmentsig.Signer, msg []byte) []byte {
	t.Helper()
	data, err := s.Seal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Never is an Acceptor that must not be reached: no backend call for a
// message that is not authentic or does not decode.
func Never(context.Context, taskassignment.Assignment) (bool, error) { panic("must not be called") }

// Tamper replaces old with replacement inside the signed message of sealed,
// keeping the signature: what a forger who copies a real message does.
func Tamper(t testing.TB, sealed []byte, old, replacement string) []byte {
	t.Helper()
	var e map[string]any
	if err := json.Unmarshal(sealed, &e); err != nil {
		t.Fatal(err)
	}
	msg, err := base64.StdEncoding.DecodeString(e["msg"].(string))
	if err != nil || !bytes.Contains(msg, []byte(old)) {
		t.Fatalf("message %s lacks %q", msg, old)
	}
	e["msg"] = base64.StdEncoding.EncodeToString(bytes.Replace(msg, []byte(old), []byte(replacement), 1))
	out, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// WithImage is a with the job image image.
func WithImage(a taskassignment.Assignment, image string) taskassignment.Assignment {
	a.Task.Image = image
	return a
}
