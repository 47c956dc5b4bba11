package sandboxapitest_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
)

// recordingTB records what the fake reports instead of failing the test.
type recordingTB struct {
	testing.TB
	mu     sync.Mutex
	errors []string
	failed bool
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	panic("FailNow")
}

func (r *recordingTB) reported() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errors...)
}

// A response of the fake that breaks the specification is a test failure:
// 501 is declared by no operation and is not an answer the real server is
// known to give outside the specification.
func TestAnOffSpecAnswerFailsTheTest(t *testing.T) {
	rec := &recordingTB{TB: t}
	fake := sandboxapitest.New(rec)
	fake.Inject(sandboxapitest.Fault{Status: http.StatusNotImplemented})
	if status, _ := do(t, fake, "GET", "/v1/sandboxes", ""); status != http.StatusNotImplemented {
		t.Fatalf("status %d", status)
	}
	errs := rec.reported()
	if len(errs) != 1 || !strings.Contains(errs[0], "breaks the OpenSandbox specification") {
		t.Fatalf("reported %q", errs)
	}
	// Declared and known off-spec answers pass.
	for _, status := range []int{500, 502, 503, 504, 429} {
		fake.Inject(sandboxapitest.Fault{Status: status})
		do(t, fake, "GET", "/v1/sandboxes", "")
	}
	if errs := rec.reported(); len(errs) != 1 {
		t.Fatalf("reported %q", errs)
	}
}
