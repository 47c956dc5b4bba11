package buildseccomp

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

var update = flag.Bool("update", false, "write deploy/seccomp/buildkit-<GOARCH>.json (make seccomp)")

// TestShippedProfileIsGenerated: the shipped profile for this architecture is
// exactly Profile's output (make seccomp rewrites it).
func TestShippedProfileIsGenerated(t *testing.T) {
	file := filepath.Join("..", "..", "deploy", "seccomp", "buildkit-"+runtime.GOARCH+".json")
	got, err := Profile()
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if os.IsNotExist(err) && runtime.GOARCH != "amd64" {
		t.Skipf("no shipped profile for %s: make seccomp on a %s machine writes it", runtime.GOARCH, runtime.GOARCH)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not Profile's output: run make seccomp", file)
	}
}

// TestProfileDeniesByDefault: the profile is an allow list (an unknown
// system call fails with an errno), and the namespace rule allows exactly
// NamespaceSyscalls, unconditionally.
func TestProfileDeniesByDefault(t *testing.T) {
	b, err := Profile()
	if err != nil {
		t.Fatal(err)
	}
	var p specs.LinuxSeccomp
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != specs.ActErrno {
		t.Fatalf("defaultAction %s, want %s", p.DefaultAction, specs.ActErrno)
	}
	last := p.Syscalls[len(p.Syscalls)-1]
	if !slices.Equal(last.Names, NamespaceSyscalls()) || last.Action != specs.ActAllow || len(last.Args) > 0 {
		t.Fatalf("last rule %+v, want an unconditional allow of %v", last, NamespaceSyscalls())
	}
	for _, forbidden := range []string{"init_module", "kexec_load", "bpf", "perf_event_open"} {
		for _, r := range p.Syscalls {
			if r.Action == specs.ActAllow && slices.Contains(r.Names, forbidden) && len(r.Args) == 0 {
				t.Errorf("%s is allowed unconditionally by %+v", forbidden, r)
			}
		}
	}
}
