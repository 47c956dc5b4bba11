package runnerpool

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/imagepolicy"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
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
		{"bad image pattern", "pools:\n- {name: a, labels: [x], backend: pod, capacity: 1, images: {allowed: ['node:[']}}", `pool "a": images.allowed: "node:["`},
		{"bad pull policy", "pools:\n- {name: a, labels: [x], backend: pod, capacity: 1, images: {pullPolicy: always}}", `images.pullPolicy: "always"`},
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

// TestCheckImages: a pool's images rule is read from the file and applied to a task's container
// and every service, naming the pool and the rule.
func TestCheckImages(t *testing.T) {
	ps, err := Parse([]byte(`
pools:
  - name: linux
    labels: [x]
    backend: pod
    capacity: 1
    images: {allowed: ["node:*"], services: ["postgres:*"]}
`), "/state")
	if err != nil {
		t.Fatal(err)
	}
	p := ps[0]
	for _, tc := range []struct {
		name string
		task taskassignment.Task
		want string // "" = admitted
	}{
		{"no images chosen", taskassignment.Task{}, ""},
		{"allowed container and service", taskassignment.Task{Image: "node:22", Services: []jobservices.Service{{ID: "db", Image: "postgres:17"}}}, ""},
		{"refused container", taskassignment.Task{Image: "ruby:3"}, `runner pool "linux": container image "ruby:3"`},
		{"refused second service", taskassignment.Task{Services: []jobservices.Service{{ID: "db", Image: "postgres:17"}, {ID: "cache", Image: "redis:7"}}},
			`runner pool "linux": service cache: image "redis:7": image not allowed: it matches none of the runner pool's images.services [postgres:*]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.CheckImages(tc.task)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !errors.Is(err, imagepolicy.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckImages = %v, want ErrRefused mentioning %q", err, tc.want)
			}
		})
	}
}

// TestPause: a pool is paused by the file (paused: true) or by GDR_PAUSED_POOLS, which names
// pools (or * alone for all). Every function loads what it names and leaves an unknown name
// alone (a typo must not stop handle or the gateway); dispatch's CheckPaused refuses it.
func TestPause(t *testing.T) {
	file := sample + "    paused: true\n" // the last pool, local
	for _, tc := range []struct {
		name, paused string
		want         map[string]bool
		wantErr      string
	}{
		{"the file only", "", map[string]bool{"linux": false, "local": true}, ""},
		{"one more", " linux ", map[string]bool{"linux": true, "local": true}, ""},
		{"every pool", "*", map[string]bool{"linux": true, "local": true}, ""},
		{"a list with an empty item", "linux,,local", map[string]bool{"linux": true, "local": true}, ""},
		{"no such pool", "linux,gpu", map[string]bool{"linux": true, "local": true}, `GDR_PAUSED_POOLS: pool "gpu" is not in the pools file`},
		{"* beside a name", "*,linux", map[string]bool{"linux": true, "local": true}, `GDR_PAUSED_POOLS: * pauses every pool: write it alone, not beside pool names`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "pools.yaml")
			if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
				t.Fatal(err)
			}
			s := PoolSettings{PoolsFile: path, StateDir: "/state", Paused: tc.paused}
			ps, err := s.Load()
			if err != nil {
				t.Fatalf("Load() error = %v: an unknown name must not stop a function", err)
			}
			for _, p := range ps {
				if p.Paused != tc.want[p.Name] {
					t.Errorf("pool %s paused = %v, want %v", p.Name, p.Paused, tc.want[p.Name])
				}
			}
			err = s.CheckPaused(ps)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("CheckPaused() = %v", err)
			case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
				t.Fatalf("CheckPaused() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
