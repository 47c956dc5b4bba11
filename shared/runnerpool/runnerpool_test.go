package runnerpool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const sample = `
pools:
  - name: linux
    labels: [ubuntu-latest, linux]
    backend: pod
    capacity: 10
    jobTimeout: 90m
    profile:
      template: /etc/gdr/pod.yaml
  - name: local
    labels: [ubuntu-latest]
    backend: process
    capacity: 2
    credentials: /var/lib/gdr/local.json
`

func TestParse(t *testing.T) {
	ps, err := Parse([]byte(sample), "/state")
	if err != nil {
		t.Fatal(err)
	}
	linux, err := ps.Get("linux")
	if err != nil {
		t.Fatal(err)
	}
	if linux.Credentials != "/state/linux.json" || linux.Timeout() != 90*time.Minute || linux.Capacity != 10 ||
		string(linux.Profile) != `{"template":"/etc/gdr/pod.yaml"}` {
		t.Fatalf("linux = %+v (profile %s)", linux, linux.Profile)
	}
	local, _ := ps.Get("local")
	if local.Credentials != "/var/lib/gdr/local.json" || local.Timeout() != DefaultJobTimeout {
		t.Fatalf("local = %+v", local)
	}
	if _, err := ps.Get("windows"); err == nil || !strings.Contains(err.Error(), `"windows"`) {
		t.Fatalf("Get(windows) = %v", err)
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct{ name, yaml, wantErr string }{
		{"no pools", "pools: []", "no pools"},
		{"unknown field", "pools:\n- {name: a, labels: [x], backend: pod, capacity: 1, size: 3}", "size"},
		{"bad name", "pools:\n- {name: A_1, labels: [x], backend: pod, capacity: 1}", `pool "A_1"`},
		{"no labels", "pools:\n- {name: a, backend: pod, capacity: 1}", "no labels"},
		{"unknown backend", "pools:\n- {name: a, labels: [x], backend: vm, capacity: 1}", `unknown backend "vm"`},
		{"zero capacity", "pools:\n- {name: a, labels: [x], backend: pod}", "capacity 0"},
		{"bad timeout", "pools:\n- {name: a, labels: [x], backend: pod, capacity: 1, jobTimeout: soon}", "soon"},
		{"duplicate", "pools:\n- {name: a, labels: [x], backend: pod, capacity: 1}\n- {name: a, labels: [y], backend: pod, capacity: 1}", "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "/state")
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Parse() error = %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}
}

func TestMatches(t *testing.T) {
	p := Pool{Labels: []string{"ubuntu-latest", "linux"}}
	for _, tc := range []struct {
		runsOn []string
		want   bool
	}{
		{[]string{"ubuntu-latest"}, true},
		{[]string{"linux", "ubuntu-latest"}, true},
		{[]string{"ubuntu-latest", "gpu"}, false},
		{nil, false},
	} {
		if got := p.Matches(tc.runsOn); got != tc.want {
			t.Errorf("Matches(%v) = %v", tc.runsOn, got)
		}
	}
}

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pools.yaml")
	if err := os.WriteFile(path, []byte(sample), 0o600); err != nil {
		t.Fatal(err)
	}
	if ps, err := Load(path, "/state"); err != nil || len(ps) != 2 {
		t.Fatalf("Load() = %v, %v", ps, err)
	}
	if _, err := Load(path+".missing", "/state"); err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
}
