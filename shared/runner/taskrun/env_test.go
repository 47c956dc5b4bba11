package taskrun

import (
	"testing"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// The variables @actions/cache and @actions/artifact read, set as Gitea's
// act_runner sets them: the runtime API under the instance, results at the
// instance itself, Gitea's runtime token; ACTIONS_CACHE_URL only when the
// runner serves a cache proxy.
func TestActionsServiceVariables(t *testing.T) {
	c, err := structpb.NewStruct(map[string]any{
		"repository": "alice/repo", "job": "build", "server_url": "http://gitea.example:3000/",
		"gitea_runtime_token": "runtime-jwt", "token": "task-token",
	})
	if err != nil {
		t.Fatal(err)
	}
	job, err := Prepare(&runnerv1.Task{Id: 7, Context: c, WorkflowPayload: []byte("on: push\njobs:\n  build:\n    runs-on: x\n    steps:\n      - run: true\n")}, Host{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		cacheURL string
	}{{"with a cache proxy", "http://127.0.0.1:4567/secret/"}, {"without", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := job.config(Options{CacheURL: tc.cacheURL})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				"ACTIONS_RUNTIME_URL":   "http://gitea.example:3000/api/actions_pipeline/",
				"ACTIONS_RESULTS_URL":   "http://gitea.example:3000",
				"ACTIONS_RUNTIME_TOKEN": "runtime-jwt",
				"ACTIONS_CACHE_URL":     tc.cacheURL,
			}
			for k, v := range want {
				if got := cfg.Env[k]; got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if _, ok := cfg.Env["ACTIONS_CACHE_URL"]; !ok && tc.cacheURL != "" || ok && tc.cacheURL == "" {
				t.Errorf("ACTIONS_CACHE_URL set: %v, want %v", ok, tc.cacheURL != "")
			}
		})
	}
}
