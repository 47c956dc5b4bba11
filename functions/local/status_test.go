package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
)

// `local status` prints what a running local mode keeps in its state
// directory, and "nothing runs" (exit 0) when none does: no status file,
// or one whose writer is gone.
func TestStatusCommand(t *testing.T) {
	report := poolstatus.Report{Time: time.Now(), Pools: []poolstatus.Pool{{Name: "local", Backend: "process", Capacity: 2, InFlight: 1, Started: 1,
		Tasks: []poolstatus.Task{{Assignment: "local-9", Task: 9, Phase: poolstatus.PhaseStarted, URL: "http://127.0.0.1:3000/alice/demo/actions/runs/4"}}}}}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		file     *statusFile
		args     []string
		wantCode int
		want     []string
		wantJSON int // pools in the JSON report; -1: not JSON
	}{
		{"none ever ran", nil, nil, 0, []string{"no local mode is running"}, -1},
		{"none ever ran, json", nil, []string{"-o", "json"}, 0, nil, 0},
		{"running", &statusFile{PID: os.Getpid(), Report: report}, nil, 0, []string{"local-9", "started", "http://127.0.0.1:3000/alice/demo/actions/runs/4"}, -1},
		{"running, json", &statusFile{PID: os.Getpid(), Report: report}, []string{"-o", "json"}, 0, []string{"local-9"}, 1},
		{"writer gone", &statusFile{PID: gone.Process.Pid, Report: report}, nil, 0, []string{"no local mode is running"}, -1},
		{"bad format", nil, []string{"-o", "yaml"}, 2, nil, -1},
		{"help", nil, []string{"-h"}, 0, nil, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.file != nil {
				if err := writeStatusFile(dir, *tc.file); err != nil {
					t.Fatal(err)
				}
			}
			var stdout, stderr bytes.Buffer
			code := runStatus(append([]string{"--state-dir", dir}, tc.args...), &stdout, &stderr)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.wantCode, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
			if tc.wantJSON >= 0 {
				var r poolstatus.Report
				if err := json.Unmarshal(stdout.Bytes(), &r); err != nil || len(r.Pools) != tc.wantJSON {
					t.Fatalf("-o json: %v, %d pools, want %d:\n%s", err, len(r.Pools), tc.wantJSON, stdout.String())
				}
			}
		})
	}
}
