package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

// `dispatch run -pool linux` sizes the payload bucket, which every pool
// shares, for the longest job of the whole pools file, not of linux alone.
func TestRunOnePoolSizesTheBucketForAll(t *testing.T) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n"+
		"  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3, jobTimeout: 2h}\n"+
		"  - {name: gpu, labels: [gpu], backend: pod, capacity: 1, jobTimeout: 10h}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, pool := range []string{"linux", "gpu"} {
		creds := gitea.Credentials{ID: 1, UUID: "uuid-" + pool, Token: gitea.Token("token-" + pool), Name: pool}
		if err := (gitea.FileStore{Path: filepath.Join(dir, pool+".json")}).Save(creds); err != nil {
			t.Fatal(err)
		}
	}
	_, url := jetstreamenv.Start(t)
	for k, v := range map[string]string{
		"GDR_GITEA_URL": "http://127.0.0.1:1/", "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir, "GDR_NATS_URL": url,
		"GDR_TRUST_DOMAIN": "ci.example.org", "GDR_PAYLOAD_KEY": testKey,
		"GDR_ASSIGNMENT_SIGNING_KEY": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=",
	} {
		t.Setenv(k, v)
	}
	// Gitea is unreachable: the round fails after the bucket is ensured.
	if code := execute(context.Background(), []string{"run", "-pool", "linux"}, io.Discard); code != 1 {
		t.Fatalf("dispatch run -pool linux exited %d, want 1 (Gitea unreachable)", code)
	}
	_, js := jetstreamenv.Connect(t, url)
	kv, err := js.KeyValue(t.Context(), assignmentqueue.DefaultPayloadBucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := 10*time.Hour + runnerpool.ReportGrace; st.TTL() != want {
		t.Fatalf("payload bucket TTL %v, want %v (gpu's job timeout and the grace)", st.TTL(), want)
	}
}
