package callcount

import (
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

func TestName(t *testing.T) {
	for _, tc := range []struct{ path, want string }{
		{"/api/actions/runner.v1.RunnerService/FetchTask", "FetchTask"},
		{"/api/actions/runner.v1.RunnerService/UpdateLog/", "UpdateLog"},
		{"/webhook", "webhook"},
		{"/", "/"},
		{"", "/"},
	} {
		r := httptest.NewRequest(http.MethodPost, "http://gitea.example.org/", nil)
		r.URL.Path = tc.path
		if got := Name(r); got != tc.want {
			t.Errorf("Name(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

// The transport counts every request it sent, by method, and as failed
// those the server answered with a 5xx or that never got an answer.
func TestTransportCountsCallsAndFailures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/UpdateTask") {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	var c Counter
	hc := &http.Client{Transport: c.Transport(nil)}
	calls := map[string]int{"FetchTask": 3, "UpdateTask": 2, "UpdateLog": 1}
	var wg sync.WaitGroup
	for name, n := range calls {
		for range n {
			wg.Go(func() {
				resp, err := hc.Post(srv.URL+"/api/actions/runner.v1.RunnerService/"+name, "application/proto", nil)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			})
		}
	}
	wg.Wait()
	want := map[string]int64{"FetchTask": 3, "UpdateTask": 2, "UpdateLog": 1}
	if got := c.Counts(); !maps.Equal(got, want) {
		t.Fatalf("Counts() = %v, want %v", got, want)
	}
	if got, want := c.Failed(), map[string]int64{"UpdateTask": 2}; !maps.Equal(got, want) {
		t.Fatalf("Failed() = %v, want %v", got, want)
	}

	before := c.Counts()
	srv.Close() // the next call gets no answer
	if _, err := hc.Post(srv.URL+"/api/actions/runner.v1.RunnerService/FetchTask", "application/proto", nil); err == nil {
		t.Fatal("a call to a closed server succeeded")
	}
	if got, want := Since(c.Counts(), before), map[string]int64{"FetchTask": 1}; !maps.Equal(got, want) {
		t.Fatalf("Since() = %v, want %v", got, want)
	}
	if got := c.Failed()["FetchTask"]; got != 1 {
		t.Fatalf("failed FetchTask = %d, want 1", got)
	}
}

type failing struct{}

func (failing) RoundTrip(*http.Request) (*http.Response, error) { return nil, errors.New("refused") }

func TestTransportCountsATransportError(t *testing.T) {
	var c Counter
	hc := &http.Client{Transport: c.Transport(failing{})}
	if _, err := hc.Get("http://gitea.example.org/api/actions/runner.v1.RunnerService/Declare"); err == nil {
		t.Fatal("no error")
	}
	if got := c.Counts()["Declare"]; got != 1 {
		t.Fatalf("Declare counted %d times, want 1", got)
	}
	if got := c.Failed()["Declare"]; got != 1 {
		t.Fatalf("Declare failed %d times, want 1", got)
	}
}

// The handler counts what it served under the key's name, whatever the
// answer, and as failed what it answered with a 5xx.
func TestHandlerCountsDeliveries(t *testing.T) {
	var c Counter
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Gitea-Event") {
		case "push":
			http.Error(w, "ignored", http.StatusAccepted)
		case "broken":
			w.WriteHeader(http.StatusInternalServerError)
			w.WriteHeader(http.StatusOK) // ignored by net/http; the first status stands
		default:
			_, _ = w.Write([]byte("ok"))
		}
	})
	srv := httptest.NewServer(c.Handler(func(r *http.Request) string { return r.Header.Get("X-Gitea-Event") }, next))
	defer srv.Close()
	for _, event := range []string{"workflow_job", "workflow_job", "push", "broken"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/webhook", nil)
		req.Header.Set("X-Gitea-Event", event)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got, want := c.Counts(), map[string]int64{"workflow_job": 2, "push": 1, "broken": 1}; !maps.Equal(got, want) {
		t.Fatalf("Counts() = %v, want %v", got, want)
	}
	if got, want := c.Failed(), map[string]int64{"broken": 1}; !maps.Equal(got, want) {
		t.Fatalf("Failed() = %v, want %v", got, want)
	}
}

func TestHandlerKeyDefaultsToName(t *testing.T) {
	var c Counter
	srv := httptest.NewServer(c.Handler(nil, http.NotFoundHandler()))
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL+"/webhook", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got, want := c.Counts(), map[string]int64{"webhook": 1}; !maps.Equal(got, want) {
		t.Fatalf("Counts() = %v, want %v", got, want)
	}
}
