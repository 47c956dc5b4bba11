package opensandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/sandboxapitest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/imagepolicy"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

func TestNewChecksTheConfig(t *testing.T) {
	client, err := sandboxapi.New(sandboxapi.Options{BaseURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	otherKeys, err := taskassignment.NewKeys("other.example.org")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		edit    func(*opensandbox.Config)
		wantErr string
	}{
		{"good; a pod pool's profile is not read", func(*opensandbox.Config) {}, ""},
		{"no API", func(c *opensandbox.Config) { c.Sandboxes = nil }, "API"},
		{"no trust domain", func(c *opensandbox.Config) { c.TrustDomain = spiffeid.TrustDomain{} }, "trust domain"},
		{"no keys", func(c *opensandbox.Config) { c.Keys = taskassignment.Keys{} }, "prefix"},
		{"keys under two prefixes", func(c *opensandbox.Config) { c.Keys.SPIFFEID = otherKeys.SPIFFEID }, "other.example.org/spiffe-id"},
		{"bad profile", func(c *opensandbox.Config) {
			c.Pools[1].Profile = json.RawMessage(`{"poolRef":"x","image":"y"}`)
		}, `pool "warm"`},
		{"no profile", func(c *opensandbox.Config) { c.Pools[0].Profile = nil }, `pool "linux"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := opensandbox.Config{Sandboxes: client, Keys: testKeys(t), TrustDomain: td, Pools: testPools()}
			tt.edit(&cfg)
			_, err := opensandbox.New(cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
}

func TestParseProfile(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    opensandbox.Profile
		wantErr string
	}{
		{"pool", `{"poolRef":"warm"}`, opensandbox.Profile{PoolRef: "warm"}, ""},
		{"pool with env", `{"poolRef":"warm","env":{"TZ":"UTC"}}`, opensandbox.Profile{PoolRef: "warm", Env: map[string]string{"TZ": "UTC"}}, ""},
		{"image", `{"image":"i:1","entrypoint":["/r"],"resourceLimits":{"cpu":"1"}}`,
			opensandbox.Profile{Image: "i:1", Entrypoint: []string{"/r"}, ResourceLimits: map[string]string{"cpu": "1"}}, ""},
		{"empty", ``, opensandbox.Profile{}, "no profile"},
		{"nothing", `{}`, opensandbox.Profile{}, "image"},
		{"pool and image", `{"poolRef":"warm","image":"i:1"}`, opensandbox.Profile{}, "poolRef excludes"},
		{"pool and resources", `{"poolRef":"warm","resourceLimits":{"cpu":"1"}}`, opensandbox.Profile{}, "poolRef excludes"},
		{"no entrypoint", `{"image":"i:1","resourceLimits":{"cpu":"1"}}`, opensandbox.Profile{}, "entrypoint"},
		{"no resources", `{"image":"i:1","entrypoint":["/r"]}`, opensandbox.Profile{}, "resourceLimits"},
		{"unknown field", `{"poolRef":"warm","pool":"x"}`, opensandbox.Profile{}, `"pool"`},
		{"two values", `{"poolRef":"warm"}{}`, opensandbox.Profile{}, "more than one"},
		{"env sets the capability", `{"poolRef":"warm","env":{"CI_RUNNER_CAPABILITY":"s3cret"}}`, opensandbox.Profile{}, "CI_RUNNER_CAPABILITY"},
		{"env sets the SVID key", `{"poolRef":"warm","env":{"CI_SVID_KEY":"s3cret"}}`, opensandbox.Profile{}, "CI_SVID_KEY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := opensandbox.ParseProfile(json.RawMessage(tt.raw))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("the error shows an env value: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !equalProfile(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func equalProfile(a, b opensandbox.Profile) bool {
	return a.PoolRef == b.PoolRef && a.Image == b.Image && strings.Join(a.Entrypoint, " ") == strings.Join(b.Entrypoint, " ") &&
		maps.Equal(a.ResourceLimits, b.ResourceLimits) && maps.Equal(a.Env, b.Env)
}

func TestCreate(t *testing.T) {
	tests := []struct {
		name           string
		pool           string
		taskImage      string
		wantImage      string
		wantPool       string
		wantEntrypoint string
		wantTimeout    int
		wantTZ         bool
	}{
		{"image profile", "linux", "", "registry.example.org/runner:1", "", "/runner --once", 90 * 60, true},
		{"the job's container image replaces the profile's", "linux", "node:20-bookworm", "node:20-bookworm", "", "/runner --once", 90 * 60, true},
		{"pool profile", "warm", "", "", "ci-warm", "", int(runnerpool.DefaultJobTimeout / time.Second), false},
		{"a pool ignores the job's image", "warm", "node:20", "", "ci-warm", "", int(runnerpool.DefaultJobTimeout / time.Second), false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			a := assignment(t, tt.pool, int64(100+i))
			a.Task.Image = tt.taskImage
			spec := h.launch(t, a)
			e, err := h.backend.Create(context.Background(), a, spec)
			if err != nil {
				t.Fatal(err)
			}
			// Create answers the sandbox Running, as the real server does.
			if e.Name == "" || e.IdentityTarget != e.Name || e.Phase != executor.PhaseRunning {
				t.Fatalf("executor = %+v", e)
			}
			sb, ok := h.fake.Sandbox(e.Name)
			if !ok {
				t.Fatalf("no sandbox %s", e.Name)
			}
			if sb.Image != tt.wantImage || sb.PoolRef != tt.wantPool || sb.Timeout != tt.wantTimeout ||
				(tt.wantEntrypoint != "" && strings.Join(sb.Entrypoint, " ") != tt.wantEntrypoint) {
				t.Fatalf("sandbox = %+v", sb)
			}
			if tt.wantPool == "" && !maps.Equal(sb.ResourceLimits, map[string]string{"cpu": "2", "memory": "4Gi"}) {
				t.Fatalf("resource limits = %v", sb.ResourceLimits)
			}
			// The environment: the executor's, plus the profile's.
			wantEnv := maps.Clone(spec.Environment)
			if tt.wantTZ {
				wantEnv["TZ"] = "UTC"
			}
			if !maps.Equal(sb.Env, wantEnv) {
				t.Fatalf("env = %v, want %v", sb.Env, wantEnv)
			}
			// The metadata: the labels as they are, the annotations encoded,
			// and nothing else; every value a label value; no environment
			// value anywhere.
			checkLabelValues(t, sb.Metadata)
			for k, v := range spec.Metadata.Labels {
				if sb.Metadata[k] != v {
					t.Fatalf("label %s = %q, want %q", k, sb.Metadata[k], v)
				}
			}
			annotations, err := opensandbox.DecodeAnnotations(prefix, sb.Metadata)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(annotations, spec.Metadata.Annotations) {
				t.Fatalf("annotations = %v, want %v", annotations, spec.Metadata.Annotations)
			}
			chunks, _ := opensandbox.EncodeAnnotations(prefix, spec.Metadata.Annotations)
			if len(sb.Metadata) != len(spec.Metadata.Labels)+len(chunks) {
				t.Fatalf("metadata has extra keys: %v", sb.Metadata)
			}
			for k, v := range sb.Metadata {
				if strings.Contains(v, spec.Environment[bootstrap.EnvCapability]) {
					t.Fatalf("metadata %s holds the capability", k)
				}
			}
			// Idempotent: a second Create finds the first sandbox.
			again, err := h.backend.Create(context.Background(), a, spec)
			if err != nil || again.Name != e.Name || h.fake.Creates() != 1 {
				t.Fatalf("second Create = %+v, %v; %d creates", again, err, h.fake.Creates())
			}
			// The assignment rebuilds from the sandbox alone.
			got, err := h.backend.RecoverAssignments(context.Background())
			if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], a) {
				t.Fatalf("recovered %+v, %v; want %+v", got, err, a)
			}
			h.noRejections(t)
		})
	}
}

func TestCreateRefuses(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(a *taskassignment.Assignment, spec *executor.LaunchSpec)
		wantErr string
	}{
		{"a pool without profile", func(a *taskassignment.Assignment, _ *executor.LaunchSpec) { a.Task.Pool = "pods" }, `"pods"`},
		{"another backend", func(a *taskassignment.Assignment, _ *executor.LaunchSpec) { a.Backend = taskassignment.BackendPod }, `"pod"`},
		{"labels without the assignment ID", func(_ *taskassignment.Assignment, s *executor.LaunchSpec) {
			delete(s.Metadata.Labels, prefix+"/assignment-id")
		}, "assignment-id"},
		{"a label the server refuses", func(_ *taskassignment.Assignment, s *executor.LaunchSpec) {
			s.Metadata.Labels[prefix+"/extra"] = "a/b"
		}, prefix + "/extra"},
		{"the environment sets a profile variable", func(_ *taskassignment.Assignment, s *executor.LaunchSpec) {
			s.Environment["TZ"] = "s3cret"
		}, `"TZ"`},
	}
	h := newHarness(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := assignment(t, "linux", 42)
			spec := h.launch(t, a)
			tt.edit(&a, &spec)
			_, err := h.backend.Create(context.Background(), a, spec)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "linux-42") {
				t.Fatalf("err = %v, want one naming %s and the assignment", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), spec.Environment[bootstrap.EnvCapability]) || strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error shows an environment value: %v", err)
			}
			if h.fake.Creates() != 0 {
				t.Fatal("a sandbox was created")
			}
		})
	}
}

// TestCreateRefusesImagesThePoolDoesNotAllow: the job's container image is the sandbox's image,
// so the pool's images rule applies: a refused one fails permanently, naming the pool and the
// rule, and creates nothing; an allowed one is the sandbox's image.
func TestCreateRefusesImagesThePoolDoesNotAllow(t *testing.T) {
	h := newHarness(t, func(c *opensandbox.Config) {
		c.Pools[0].Images = imagepolicy.Policy{Allowed: &[]string{"node:*"}}
	})
	a := assignment(t, "linux", 43)
	a.Task.Image = "ruby:3"
	_, err := h.backend.Create(context.Background(), a, h.launch(t, a))
	if err == nil || !executor.IsPermanent(err) || !errors.Is(err, imagepolicy.ErrRefused) ||
		!strings.Contains(err.Error(), `runner pool "linux": container image "ruby:3"`) || !strings.Contains(err.Error(), "images.allowed [node:*]") {
		t.Fatalf("Create = %v; want a permanent refusal naming the pool, the image and the rule", err)
	}
	if h.fake.Creates() != 0 {
		t.Fatal("a sandbox was created for a refused image")
	}
	a = assignment(t, "linux", 44)
	a.Task.Image = "node:22"
	if _, err := h.backend.Create(context.Background(), a, h.launch(t, a)); err != nil {
		t.Fatalf("an allowed image: %v", err)
	}
	if h.fake.Creates() != 1 {
		t.Fatalf("%d sandboxes created for an allowed image, want 1", h.fake.Creates())
	}
}

func TestFindMapsStatesToPhases(t *testing.T) {
	tests := []struct {
		state string
		want  executor.Phase
	}{
		{"Pending", executor.PhasePending},
		{"Allocated", executor.PhasePending},
		{"Resuming", executor.PhasePending},
		{"Running", executor.PhaseRunning},
		{"running", executor.PhaseRunning},
		{"Terminated", executor.PhaseSucceeded},
		{"Failed", executor.PhaseFailed},
		{"Pausing", executor.PhaseUnknown},
		{"Paused", executor.PhaseUnknown},
		{"Stopping", executor.PhaseUnknown},
		{"Unknown", executor.PhaseUnknown},
		{"Hibernating", executor.PhaseUnknown},
	}
	h := newHarness(t)
	ctx := context.Background()
	if e, err := h.backend.Find(ctx, "linux-1"); e != nil || err != nil {
		t.Fatalf("Find of nothing = %+v, %v", e, err)
	}
	for i, tt := range tests {
		t.Run(tt.state, func(t *testing.T) {
			a := assignment(t, "linux", int64(i+1))
			created := h.create(t, a)
			h.fake.SetState(created.Name, tt.state)
			e, err := h.backend.Find(ctx, a.ID)
			if err != nil {
				t.Fatal(err)
			}
			want := executor.Executor{Name: created.Name, IdentityTarget: created.Name, Phase: tt.want}
			if e == nil || e.Name != want.Name || e.IdentityTarget != want.IdentityTarget || e.Phase != want.Phase { // Reason: TestFailedSandboxReason
				t.Fatalf("Find = %+v, want %+v", e, want)
			}
		})
	}
	// A sandbox carrying the terminal marker is still found, so that it can
	// be deleted; one of another assignment is not.
	a := assignment(t, "linux", 1)
	e, _ := h.backend.Find(ctx, a.ID)
	mark := "true"
	if _, err := h.client.PatchMetadata(ctx, e.Name, map[string]*string{prefix + "/terminal": &mark}); err != nil {
		t.Fatal(err)
	}
	if got, err := h.backend.Find(ctx, a.ID); err != nil || got == nil || got.Name != e.Name {
		t.Fatalf("Find of a marked sandbox = %+v, %v", got, err)
	}
	// A live sandbox of the assignment wins over an older one being deleted.
	newer := h.seed(t, a)
	if got, err := h.backend.Find(ctx, a.ID); err != nil || got == nil || got.Name != newer {
		t.Fatalf("Find = %+v, %v; want the unmarked %s", got, err, newer)
	}
	h.noRejections(t)
}

func TestBindIdentity(t *testing.T) {
	other := spiffeid.RequireTrustDomainFromString("other.example.org")
	tests := []struct {
		name    string
		edit    func(h *harness, e *executor.Executor, id *taskidentity.Identity)
		wantErr string
	}{
		{"the persisted identity", func(*harness, *executor.Executor, *taskidentity.Identity) {}, ""},
		{"another task's identity", func(_ *harness, _ *executor.Executor, id *taskidentity.Identity) {
			*id, _ = taskidentity.New(td, "Alice/Repo.Name", "build", 43)
		}, "task/142"},
		{"an identity in another trust domain", func(_ *harness, _ *executor.Executor, id *taskidentity.Identity) {
			*id, _ = taskidentity.New(other, "Alice/Repo.Name", "build", 242)
		}, "trust domain"},
		{"annotations rewritten with another SPIFFE ID", func(h *harness, e *executor.Executor, _ *taskidentity.Identity) {
			forged, _ := opensandbox.EncodeAnnotations(prefix, map[string]string{prefix + "/spiffe-id": "spiffe://ci.example.org/repo/mallory/x/task/342"})
			sb, _ := h.fake.Sandbox(e.Name)
			for k := range sb.Metadata {
				if strings.Contains(k, "/annotations-") {
					h.fake.SetMetadata(e.Name, k, nil)
				}
			}
			for k, v := range forged {
				h.fake.SetMetadata(e.Name, k, &v)
			}
		}, "mallory"},
		{"a chunk missing", func(h *harness, e *executor.Executor, _ *taskidentity.Identity) {
			h.fake.SetMetadata(e.Name, prefix+"/annotations-001", nil)
		}, "annotations-001"},
		{"the sandbox is gone", func(h *harness, e *executor.Executor, _ *taskidentity.Identity) {
			_ = h.client.Delete(context.Background(), e.Name)
		}, "404"},
		{"no target", func(_ *harness, e *executor.Executor, _ *taskidentity.Identity) { e.IdentityTarget = "" }, "no sandbox"},
	}
	h := newHarness(t)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := assignment(t, "linux", 42+int64(i)*100)
			e := h.create(t, a)
			id := a.Identity
			tt.edit(h, e, &id)
			err := h.backend.BindIdentity(context.Background(), e, id)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
}

// Delete marks the sandbox terminal before deleting it; if the delete fails
// after the mark, recovery leaves the sandbox out and finishes the delete.
func TestDeleteMarksTerminalAndRecoveryFinishes(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a := assignment(t, "linux", 42)
	e := h.create(t, a)
	h.fake.Inject(sandboxapitest.Fault{Method: "DELETE", Status: 503, Times: fastRetry.MaxAttempts()})
	if err := h.backend.Delete(ctx, e); err == nil {
		t.Fatal("Delete succeeded although every DELETE failed")
	}
	sb, ok := h.fake.Sandbox(e.Name)
	if !ok || sb.Metadata[prefix+"/terminal"] != "true" {
		t.Fatalf("sandbox = %+v, %v; want it marked terminal", sb, ok)
	}
	if found, _ := h.backend.Find(ctx, a.ID); found == nil || found.Name != e.Name {
		t.Fatalf("Find = %+v, want the marked sandbox", found)
	}
	got, err := h.backend.RecoverAssignments(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("recovered %+v, %v; want the marked sandbox left out", got, err)
	}
	if _, ok := h.fake.Sandbox(e.Name); ok {
		t.Fatal("recovery did not finish the deletion")
	}
	if names := h.eventNames(); len(names) != 1 || names[0] != opensandbox.EventSkippedTerminal {
		t.Fatalf("events = %v", names)
	}
	for range 2 {
		if err := h.backend.Delete(ctx, e); err != nil {
			t.Fatalf("Delete of a deleted sandbox: %v", err)
		}
	}
	h.noRejections(t)
}

// A sandbox whose mark cannot be set is deleted all the same.
func TestDeleteWithoutMark(t *testing.T) {
	h := newHarness(t)
	e := h.create(t, assignment(t, "linux", 42))
	h.fake.Inject(sandboxapitest.Fault{Method: "PATCH", Status: 500, Times: fastRetry.MaxAttempts()})
	if err := h.backend.Delete(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.fake.Sandbox(e.Name); ok {
		t.Fatal("the sandbox still exists")
	}
}

func TestCreateRetries(t *testing.T) {
	tests := []struct {
		name        string
		faults      []sandboxapitest.Fault
		wantErr     bool
		wantCreates int
		wantPosts   int
		wantRetries int
	}{
		{"answer lost after the create took effect", []sandboxapitest.Fault{{Method: "POST", Status: 503, AfterEffect: true}}, false, 1, 1, 0},
		{"every answer lost", []sandboxapitest.Fault{{Method: "POST", Status: 502, AfterEffect: true, Times: 9}}, false, 1, 1, 0},
		{"refused twice, then created", []sandboxapitest.Fault{{Method: "POST", Status: 503, Times: 2}}, false, 1, 3, 2},
		{"throttled, then created", []sandboxapitest.Fault{{Method: "POST", Status: 429, RetryAfter: 1}}, false, 1, 2, 1},
		{"throttled for good", []sandboxapitest.Fault{{Method: "POST", Status: 429, Times: 99}}, true, 0, 4, 3},
		{"lists fail too, then recover", []sandboxapitest.Fault{{Status: 500, Times: 2}, {Method: "POST", Status: 500}}, false, 1, 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			for _, f := range tt.faults {
				h.fake.Inject(f)
			}
			a := assignment(t, "linux", 42)
			e, err := h.backend.Create(context.Background(), a, h.launch(t, a))
			if (err != nil) != tt.wantErr {
				t.Fatalf("Create: %+v, %v", e, err)
			}
			if err != nil && (!sandboxapi.Retryable(err) || !strings.Contains(err.Error(), a.ID)) {
				t.Fatalf("err = %v, want a retryable error naming the assignment", err)
			}
			retries := 0
			for _, n := range h.eventNames() {
				if n == opensandbox.EventCreateRetried {
					retries++
				}
			}
			if h.fake.Creates() != tt.wantCreates || h.fake.Calls("POST", "/sandboxes") != tt.wantPosts || retries != tt.wantRetries {
				t.Fatalf("creates %d, posts %d, retries %d; want %d, %d, %d", h.fake.Creates(), h.fake.Calls("POST", "/sandboxes"), retries,
					tt.wantCreates, tt.wantPosts, tt.wantRetries)
			}
			if !tt.wantErr && len(h.fake.Sandboxes()) != 1 {
				t.Fatalf("sandboxes = %+v", h.fake.Sandboxes())
			}
		})
	}
}

// Two Creates of one assignment that both find nothing both create; the
// younger sandbox is deleted and both return the older.
func TestCreateRace(t *testing.T) {
	h := newHarness(t)
	h.fake.SetLatency(100 * time.Millisecond) // both Finds answer before either create
	a := assignment(t, "linux", 42)
	spec := h.launch(t, a)
	var (
		wg      sync.WaitGroup
		results [2]*executor.Executor
		errs    [2]error
	)
	for i := range results {
		wg.Go(func() { results[i], errs[i] = h.backend.Create(context.Background(), a, spec) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	left := h.fake.Sandboxes()
	if h.fake.Creates() != 2 {
		t.Fatalf("%d creates: the race did not happen; the test needs both Finds to answer first", h.fake.Creates())
	}
	if len(left) != 1 || results[0].Name != left[0].ID || results[1].Name != left[0].ID {
		t.Fatalf("results %+v %+v, sandboxes left %+v", results[0], results[1], left)
	}
	if names := h.eventNames(); len(names) != 1 || names[0] != opensandbox.EventDuplicateDeleted {
		t.Fatalf("events = %v", names)
	}
}

func TestRecoverySkipsAndReports(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	good := assignment(t, "linux", 1)
	goodSandbox := h.create(t, good)

	// A younger duplicate of the same assignment (a lost race whose loser
	// crashed) is left out.
	dup := h.seed(t, good)

	// Metadata that no longer rebuilds an assignment.
	corrupt := map[string]func(id string){
		"chunk missing": func(id string) { h.fake.SetMetadata(id, prefix+"/annotations-000", nil) },
		"chunk tampered": func(id string) {
			sb, _ := h.fake.Sandbox(id)
			v := sb.Metadata[prefix+"/annotations-001"]
			v = v[:20] + "." + v[21:]
			h.fake.SetMetadata(id, prefix+"/annotations-001", &v)
		},
		"task label changed": func(id string) { v := "7"; h.fake.SetMetadata(id, prefix+"/task-id", &v) },
		"another backend":    func(id string) { v := "pod"; h.fake.SetMetadata(id, prefix+"/backend", &v) },
		"another trust domain": func(id string) {
			foreign := assignment(t, "linux", 5)
			other, _ := taskidentity.New(spiffeid.RequireTrustDomainFromString("other.example.org"), "Alice/Repo.Name", "build", 5)
			foreign.Identity = other
			chunks, _ := opensandbox.EncodeAnnotations(prefix, h.keys.Metadata(foreign).Annotations)
			for k, v := range chunks {
				h.fake.SetMetadata(id, k, &v)
			}
		},
	}
	corruptIDs := map[string]string{}
	taskID := int64(10)
	for name, spoil := range corrupt {
		taskID++
		e := h.create(t, assignment(t, "linux", taskID))
		spoil(e.Name)
		corruptIDs[e.Name] = name
	}
	// Sandboxes of another installation are never listed.
	h.fake.Seed([]byte(`{"extensions":{"poolRef":"x"},"metadata":{"other.example.org/runner":"true"}}`))

	got, err := h.backend.RecoverAssignments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !reflect.DeepEqual(got[0], good) {
		t.Fatalf("recovered %+v, want only %+v", got, good)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.corrupt) != len(corrupt) {
		t.Fatalf("reported corrupt: %v", h.corrupt)
	}
	for id, name := range corruptIDs {
		err, ok := h.corrupt[id]
		if !ok || !strings.Contains(err.Error(), id) {
			t.Fatalf("%s: sandbox %s reported as %v", name, id, err)
		}
	}
	if len(h.events) != 1 || h.events[0].Name != opensandbox.EventSkippedDuplicate || h.events[0].SandboxID != dup || h.events[0].AssignmentID != good.ID {
		t.Fatalf("events = %+v (kept %s)", h.events, goodSandbox.Name)
	}
}

// seed makes a sandbox for a directly in the fake, with the metadata Create
// writes, and returns its ID.
func (h *harness) seed(t testing.TB, a taskassignment.Assignment) string {
	t.Helper()
	md := h.keys.Metadata(a)
	metadata := maps.Clone(md.Labels)
	chunks, err := opensandbox.EncodeAnnotations(prefix, md.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(metadata, chunks)
	body, err := json.Marshal(map[string]any{"extensions": map[string]string{"poolRef": "ci-warm"}, "timeout": 3600, "metadata": metadata})
	if err != nil {
		t.Fatal(err)
	}
	return h.fake.Seed(body)
}

// Recovery walks every page; a sandbox whose chunk was tampered with is
// reported and skipped, the others are all recovered.
func TestRecoverThousandSandboxes(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	want := map[string]taskassignment.Assignment{}
	// The first through Create: the seeded ones must look the same.
	first := assignment(t, "warm", 1)
	firstSandbox := h.create(t, first)
	want[first.ID] = first
	ids := []string{firstSandbox.Name}
	for i := int64(2); i <= 1000; i++ {
		a := assignment(t, "warm", i)
		want[a.ID] = a
		ids = append(ids, h.seed(t, a))
	}
	created, _ := h.fake.Sandbox(firstSandbox.Name)
	seededFirst, _ := h.fake.Sandbox(h.seed(t, first))
	if !maps.Equal(created.Metadata, seededFirst.Metadata) {
		t.Fatalf("seeded metadata %v differs from Create's %v", seededFirst.Metadata, created.Metadata)
	}
	_ = h.client.Delete(ctx, seededFirst.ID)

	tampered := ids[567]
	sb, _ := h.fake.Sandbox(tampered)
	v := sb.Metadata[prefix+"/annotations-001"]
	v = v[:30] + "." + v[31:]
	h.fake.SetMetadata(tampered, prefix+"/annotations-001", &v)
	tamperedAssignment := sb.Metadata[prefix+"/assignment-id"]

	pagesBefore := h.fake.Calls("GET", "/sandboxes")
	got, err := h.backend.RecoverAssignments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pages := h.fake.Calls("GET", "/sandboxes") - pagesBefore; pages != 5 {
		t.Fatalf("%d pages, want 5 of 200", pages)
	}
	if len(got) != 999 {
		t.Fatalf("recovered %d, want 999", len(got))
	}
	for _, a := range got {
		if !reflect.DeepEqual(want[a.ID], a) || a.ID == tamperedAssignment {
			t.Fatalf("recovered %+v, want %+v", a, want[a.ID])
		}
		delete(want, a.ID)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.corrupt[tampered]; len(h.corrupt) != 1 || !errors.Is(err, opensandbox.ErrCorruptAnnotations) {
		t.Fatalf("corrupt = %v, want only %s", h.corrupt, tampered)
	}
	h.noRejections(t)
}

// taskState is Gitea for the worker: a task turns terminal once reported.
type taskState struct {
	mu       sync.Mutex
	terminal map[int64]bool
	reports  []string
}

func (s *taskState) Terminal(_ context.Context, id int64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.terminal[id], nil
}

func (s *taskState) Report(_ context.Context, id int64, e executor.Executor) error {
	p := e.Phase
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reports = append(s.reports, string(p))
	s.terminal[id] = true
	return nil
}

// The worker, end to end on this backend: create and bind on Accept
// through faults without a second sandbox, nothing while running, report
// then delete once the sandbox ended, delete at once when Gitea ends the
// task.
func TestWorkerEndToEnd(t *testing.T) {
	tests := []struct {
		name       string
		end        func(h *harness, tasks *taskState, sandboxID string, taskID int64)
		wantReport []string
	}{
		{"terminated", func(h *harness, _ *taskState, id string, _ int64) { h.fake.SetState(id, "Terminated") }, []string{"succeeded"}},
		{"failed", func(h *harness, _ *taskState, id string, _ int64) { h.fake.SetState(id, "Failed") }, []string{"failed"}},
		{"cancelled in Gitea", func(_ *harness, tasks *taskState, _ string, taskID int64) {
			tasks.mu.Lock()
			tasks.terminal[taskID] = true
			tasks.mu.Unlock()
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			tasks := &taskState{terminal: map[int64]bool{}}
			var events []executor.Event
			w := executor.Worker{Backend: h.backend, Tasks: tasks, Bootstrap: h.boot, Keys: h.keys,
				OnEvent: func(e executor.Event) { events = append(events, e) }}
			a := assignment(t, "linux", 42)

			// Faults on the way in: two failed lists, a create whose answer
			// is lost.
			h.fake.FailNext(2, 503)
			h.fake.Inject(sandboxapitest.Fault{Method: "POST", Status: 502, AfterEffect: true})
			ok, err := w.Accept(ctx, a)
			if err != nil || !ok {
				t.Fatalf("Accept = %v, %v", ok, err)
			}
			if ok, err := w.Accept(ctx, a); err != nil || !ok {
				t.Fatalf("Accept again = %v, %v", ok, err)
			}
			sandboxes := h.fake.Sandboxes()
			if h.fake.Creates() != 1 || len(sandboxes) != 1 {
				t.Fatalf("%d creates, sandboxes %+v", h.fake.Creates(), sandboxes)
			}
			id := sandboxes[0].ID

			h.fake.SetState(id, "Running")
			if done, err := w.Finish(ctx, a); err != nil || done {
				t.Fatalf("Handle while running = %v, %v", done, err)
			}
			if len(tasks.reports) != 0 {
				t.Fatalf("reported %v while running", tasks.reports)
			}

			tt.end(h, tasks, id, a.Task.ID)
			if done, err := w.Finish(ctx, a); err != nil || !done {
				t.Fatalf("Handle at the end = %v, %v", done, err)
			}
			if strings.Join(tasks.reports, ",") != strings.Join(tt.wantReport, ",") {
				t.Fatalf("reports = %v, want %v", tasks.reports, tt.wantReport)
			}
			if _, err := h.client.Get(ctx, id); !sandboxapi.IsNotFound(err) {
				t.Fatalf("Get after the end: %v, want 404", err)
			}
			// Once over, over: nothing is created again.
			if done, err := w.Finish(ctx, a); err != nil || !done || h.fake.Creates() != 1 {
				t.Fatalf("Handle after the end = %v, %v, %d creates", done, err, h.fake.Creates())
			}
			if got, err := h.backend.RecoverAssignments(ctx); err != nil || len(got) != 0 {
				t.Fatalf("recovered %+v, %v after the end", got, err)
			}

			// No credential in an event.
			env, _ := h.boot.Environment(a)
			capability := env[bootstrap.EnvCapability]
			for _, e := range events {
				if strings.Contains(e.Executor+e.AssignmentID+string(e.Phase), capability) {
					t.Fatalf("event %+v holds the capability", e)
				}
			}
			h.noRejections(t)
		})
	}
}
