package sandboxapitest_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
)

// SetFaults decides per request; a dropped request gets no answer, before or
// after it took effect; Created keeps deleted sandboxes.
func TestSetFaultsAndCreated(t *testing.T) {
	fake := sandboxapitest.New(t)
	faults := make(chan sandboxapitest.Fault, 1)
	fake.SetFaults(func(method, path string) *sandboxapitest.Fault {
		if method != "POST" || path != "/sandboxes" {
			return nil
		}
		select {
		case f := <-faults:
			return &f
		default:
			return nil
		}
	})
	post := func() error {
		resp, err := http.Post(fake.URL+"/v1/sandboxes", "application/json", strings.NewReader("{"+image+"}"))
		if err == nil {
			resp.Body.Close()
		}
		return err
	}

	faults <- sandboxapitest.Fault{Drop: true}
	if err := post(); err == nil {
		t.Error("a dropped request was answered")
	}
	if n := len(fake.Created()); n != 0 {
		t.Errorf("a request dropped before its effect created %d sandboxes", n)
	}
	faults <- sandboxapitest.Fault{Drop: true, AfterEffect: true}
	if err := post(); err == nil {
		t.Error("a dropped request was answered")
	}
	if n := len(fake.Created()); n != 1 {
		t.Fatalf("a request dropped after its effect created %d sandboxes, want 1", n)
	}
	id := fake.Created()[0].ID
	if status, body := do(t, fake, "DELETE", "/v1/sandboxes/"+id, ""); status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", status, body)
	}
	if fake.Transition(id, "Running") {
		t.Error("Transition of a deleted sandbox reported it exists")
	}
	if c := fake.Created(); len(c) != 1 || c[0].ID != id {
		t.Errorf("Created after the delete = %+v, want the deleted sandbox", c)
	}
}
