package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
)

// `dispatch status` reads the queue as it is: exit 0 with nothing running
// (even before dispatch ever ran: no bucket), then a task waiting; `-o
// json` parses.
func TestStatus(t *testing.T) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, url := jetstreamenv.Start(t)
	env := map[string]string{
		"GDR_GITEA_URL": "http://127.0.0.1:1/", "GDR_POOLS_FILE": pools, "GDR_STATE_DIR": dir, "GDR_NATS_URL": url,
		"GDR_TRUST_DOMAIN": "ci.example.org", "GDR_PAYLOAD_KEY": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)),
		"GDR_ASSIGNMENT_SIGNING_KEY": "c2lnbmluZy1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OWE=",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	status := func(args ...string) (poolstatus.Report, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := executeTo(context.Background(), append([]string{"status"}, args...), &stdout, &stderr); code != 0 {
			t.Fatalf("dispatch status %q exited %d:\n%s", args, code, stderr.String())
		}
		var r poolstatus.Report
		if len(args) > 0 && args[len(args)-1] == "json" {
			if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
				t.Fatalf("-o json does not parse: %v\n%s", err, stdout.String())
			}
		}
		return r, stdout.String()
	}
	if r, _ := status("-o", "json"); len(r.Pools) != 1 || r.Pools[0].InFlight != 0 || r.Pools[0].Capacity != 3 {
		t.Fatalf("before any dispatch: %+v", r)
	}
	q := jetstreamenv.NewQueue(t) // its payload key is GDR_PAYLOAD_KEY's
	t.Setenv("GDR_NATS_URL", q.URL)
	if err := q.Payloads.Put(t.Context(), "linux-5", &runnerv1.Task{Id: 5}); err != nil {
		t.Fatal(err)
	}
	r, _ := status("-o", "json")
	if p := r.Pools[0]; p.InFlight != 1 || p.Waiting != 1 || len(p.Tasks) != 1 || p.Tasks[0].Assignment != "linux-5" || p.Tasks[0].Phase != poolstatus.PhaseWaiting {
		t.Fatalf("one task waiting: %+v", r)
	}
	if _, table := status(); !strings.Contains(table, "linux-5") || !strings.Contains(table, "waiting") {
		t.Fatalf("table:\n%s", table)
	}
	var stderr bytes.Buffer
	if code := executeTo(context.Background(), []string{"status", "-o", "yaml"}, &bytes.Buffer{}, &stderr); code != 2 {
		t.Fatalf("status -o yaml exited %d, want 2:\n%s", code, stderr.String())
	}
}
