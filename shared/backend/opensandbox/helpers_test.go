package opensandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

var (
	_ executor.Backend      = (*opensandbox.Backend)(nil)
	_ opensandbox.Sandboxes = (*sandboxapi.Client)(nil)
)

var (
	td        = spiffeid.RequireTrustDomainFromString("ci.example.org")
	fastRetry = sandboxapi.Retry{Attempts: 4, Initial: time.Millisecond, Max: 5 * time.Millisecond}
)

const (
	imageProfile = `{"image":"registry.example.org/runner:1","entrypoint":["/runner","--once"],"resourceLimits":{"cpu":"2","memory":"4Gi"},"env":{"TZ":"UTC"}}`
	gatewayURL   = "https://gateway.example.org"
)

func testPools() runnerpool.Pools {
	return runnerpool.Pools{
		{Name: "linux", Labels: []string{"linux"}, Backend: taskassignment.BackendOpenSandbox, Capacity: 10,
			JobTimeout: runnerpool.Duration(90 * time.Minute), Profile: json.RawMessage(imageProfile)},
		{Name: "warm", Labels: []string{"warm"}, Backend: taskassignment.BackendOpenSandbox, Capacity: 10,
			Profile: json.RawMessage(`{"poolRef":"ci-warm"}`)},
		{Name: "pods", Labels: []string{"pods"}, Backend: taskassignment.BackendPod, Capacity: 1,
			Profile: json.RawMessage(`{"a pod template": true}`)},
	}
}

func testKeys(t testing.TB) taskassignment.Keys {
	t.Helper()
	k, err := taskassignment.NewKeys(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// harness is a backend on a fake server, recording what the backend
// reports.
type harness struct {
	fake    *sandboxapitest.Server
	client  *sandboxapi.Client
	backend *opensandbox.Backend
	keys    taskassignment.Keys
	boot    *bootstrap.Bootstrap

	mu      sync.Mutex
	events  []opensandbox.Event
	corrupt map[string]error
}

func newHarness(t *testing.T, edit ...func(*opensandbox.Config)) *harness {
	t.Helper()
	return newHarnessOn(t, nil, edit...)
}

// newHarnessOn is newHarness on a fake made with opts (a runtime, a
// maximum timeout) besides the API key.
func newHarnessOn(t *testing.T, opts []sandboxapitest.Option, edit ...func(*opensandbox.Config)) *harness {
	t.Helper()
	fake := sandboxapitest.New(t, append([]sandboxapitest.Option{sandboxapitest.WithAPIKey("api-key")}, opts...)...)
	h := &harness{fake: fake, keys: testKeys(t), corrupt: map[string]error{}}
	var err error
	h.client, err = sandboxapi.New(sandboxapi.Options{BaseURL: h.fake.URL, APIKey: "api-key", Retry: fastRetry})
	if err != nil {
		t.Fatal(err)
	}
	h.boot, err = bootstrap.New(bytes.Repeat([]byte{7}, 32), gatewayURL, spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := opensandbox.Config{
		Sandboxes:   h.client,
		Keys:        h.keys,
		TrustDomain: td,
		Pools:       testPools(),
		CreateRetry: fastRetry,
		OnEvent: func(e opensandbox.Event) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.events = append(h.events, e)
		},
		OnCorrupt: func(id string, err error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if _, dup := h.corrupt[id]; dup {
				t.Errorf("sandbox %s reported corrupt twice", id)
			}
			h.corrupt[id] = err
		},
	}
	for _, e := range edit {
		e(&cfg)
	}
	h.backend, err = opensandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) eventNames() []opensandbox.EventName {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []opensandbox.EventName
	for _, e := range h.events {
		out = append(out, e.Name)
	}
	return out
}

func (h *harness) noRejections(t *testing.T) {
	t.Helper()
	if r := h.fake.Rejections(); len(r) > 0 {
		t.Fatalf("the fake refused requests of the backend: %+v", r)
	}
}

func assignment(t testing.TB, pool string, taskID int64) taskassignment.Assignment {
	t.Helper()
	id, err := taskidentity.New(td, "Alice/Repo.Name", "build", taskID)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendOpenSandbox, taskassignment.Task{ID: taskID, Pool: pool}, id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// launch is what the worker gives Create for a.
func (h *harness) launch(t testing.TB, a taskassignment.Assignment) executor.LaunchSpec {
	t.Helper()
	env, err := h.boot.Environment(a)
	if err != nil {
		t.Fatal(err)
	}
	return executor.LaunchSpec{Metadata: h.keys.Metadata(a), Environment: env}
}

func (h *harness) create(t testing.TB, a taskassignment.Assignment) *executor.Executor {
	t.Helper()
	e, err := h.backend.Create(context.Background(), a, h.launch(t, a))
	if err != nil {
		t.Fatal(err)
	}
	return e
}
