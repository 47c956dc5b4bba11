package main

import (
	"encoding/base64"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
)

// TestOldPayloadKeyReachesRecover: recover (its passes and the manual recover-now and
// recover-status Jobs, which run this build) reads GDR_PAYLOAD_OLD_KEYS into its payload store:
// a payload dispatch sealed under the old key opens once the key is listed, and not otherwise.
func TestOldPayloadKeyReachesRecover(t *testing.T) {
	q := jetstreamenv.NewQueue(t) // its payloads are sealed with q.Key: the old key here
	if err := q.Payloads.Put(t.Context(), "linux-1", &runnerv1.Task{Id: 1}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: process, capacity: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The pool's registration, as `dispatch register` leaves it (nothing here calls Gitea).
	if err := (gitea.FileStore{Path: filepath.Join(dir, "linux.json")}).Save(gitea.Credentials{ID: 1, UUID: "uuid", Token: "runner-token"}); err != nil {
		t.Fatal(err)
	}
	oldKey := base64.StdEncoding.EncodeToString(q.Key)
	current := "cGF5bG9hZC1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE="
	for _, tc := range []struct {
		name   string
		oldVar string
		opens  bool
	}{
		{"listed", oldKey, true},
		{"listed after another", current + "," + oldKey, true},
		{"not listed", "", false},
		{"another listed", current, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := baseEnv(dir, pools, current)
			env["GDR_CA_DIR"], env["GDR_NATS_URL"], env["GDR_PAYLOAD_OLD_KEYS"] = filepath.Join(dir, "ca"), q.URL, tc.oldVar
			for k, v := range env {
				t.Setenv(k, v)
			}
			cfg, err := loadConfig()
			if err != nil {
				t.Fatal(err)
			}
			r, _, closeAll, err := build(t.Context(), cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll()
			task, err := r.Payloads.Get(t.Context(), "linux-1")
			switch {
			case tc.opens && (err != nil || task.GetId() != 1):
				t.Fatalf("Get = %v, %v; want task 1", task, err)
			case !tc.opens && !errors.Is(err, assignmentqueue.ErrPayloadSealed):
				t.Fatalf("Get = %v, %v; want ErrPayloadSealed", task, err)
			}
		})
	}
}
