package layout

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gitea-dynamic-runner/gitea-dynamic-runner/"

// The cores and the transports are the package map's (docs/ARCHITECTURE.md,
// its layer column): layer(t, layerCore) and layer(t, layerTransport). A
// core sees the queue, the Knative sink and Gitea only through interfaces of
// its own, so that each is tested with fakes and no transport decides what
// it means; a transport never depends on a core: a core is wired to a
// transport by a function's main, never the other way round.

// forbiddenForCores are the transports a core must not link, even through
// another package. The others are what cores are built on (assignmentsig's
// envelopes in handle's core, delivery's retry-or-terminate in handle's and
// recover's); each name here must be a transport of the package map.
var forbiddenForCores = []string{"shared/assignmentqueue", "shared/assignmentevents", "shared/gitea"}

// violation is package Pkg linking Dep, which a rule forbids it.
type violation struct{ Pkg, Dep string }

// violations returns every (p, d) with p in from and d one of forbidden among
// p's dependencies in deps, in from's order, then deps[p]'s. deps holds each
// package's dependencies, indirect ones included (as linked gives them), so
// an import through another package is caught as a direct one is.
func violations(deps map[string][]string, from, forbidden []string) []violation {
	var vs []violation
	for _, p := range from {
		for _, d := range deps[p] {
			if slices.Contains(forbidden, d) {
				vs = append(vs, violation{Pkg: p, Dep: d})
			}
		}
	}
	return vs
}

// linked returns, for each of pkgs, the module's own packages it links,
// directly or not (go list's Deps, the set -deps lists; itself excluded), as
// paths relative to the module. A package go list does not report fails t,
// so a rule never passes for want of a package's dependencies.
func linked(t *testing.T, pkgs []string) map[string][]string {
	t.Helper()
	args := []string{"list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}"}
	for _, p := range pkgs {
		args = append(args, "./"+p)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(pkgs, " "), err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, ok := strings.CutPrefix(f[0], module)
		if !ok {
			t.Fatalf("go list reported %s, not a package of the module", f[0])
		}
		own := []string{}
		for _, d := range f[1:] {
			if rel, ok := strings.CutPrefix(d, module); ok && rel != pkg {
				own = append(own, rel)
			}
		}
		deps[pkg] = own
	}
	for _, p := range pkgs {
		if _, ok := deps[p]; !ok {
			t.Fatalf("go list did not report %s", p)
		}
	}
	return deps
}

func TestCoresSeeNoTransport(t *testing.T) {
	cores, transports := layer(t, layerCore), layer(t, layerTransport)
	for _, f := range forbiddenForCores {
		if !slices.Contains(transports, f) {
			t.Errorf("forbiddenForCores names %s, which docs/ARCHITECTURE.md's package map does not call a transport", f)
		}
	}
	for _, v := range violations(linked(t, cores), cores, forbiddenForCores) {
		t.Errorf("core %s links %s; declare what it needs as an interface of its own (or in shared/taskassignment)", v.Pkg, v.Dep)
	}
}

func TestTransportsLinkNoCore(t *testing.T) {
	cores, transports := layer(t, layerCore), layer(t, layerTransport)
	for _, v := range violations(linked(t, transports), transports, cores) {
		t.Errorf("transport %s links core %s", v.Pkg, v.Dep)
	}
}

// The rule itself, fed dependency lists as linked returns them: a forbidden
// package is caught whether imported directly or through another, and only
// from the packages the rule is about.
func TestViolations(t *testing.T) {
	cores := []string{"shared/handler", "shared/poolstatus"}
	transports := []string{"shared/gitea", "shared/delivery"}
	for _, tc := range []struct {
		name      string
		deps      map[string][]string
		from      []string
		forbidden []string
		want      []violation
	}{
		{"clean", map[string][]string{"shared/handler": {"shared/taskassignment", "shared/delivery"}},
			cores, []string{"shared/gitea"}, nil},
		{"core imports a forbidden transport", map[string][]string{"shared/handler": {"shared/taskassignment", "shared/gitea"}},
			cores, []string{"shared/gitea"}, []violation{{"shared/handler", "shared/gitea"}}},
		{"through another package", map[string][]string{"shared/poolstatus": {"shared/executor", "shared/gitea", "shared/taskassignment"}},
			cores, []string{"shared/gitea"}, []violation{{"shared/poolstatus", "shared/gitea"}}},
		{"transport links a core", map[string][]string{"shared/delivery": {"shared/poolstatus"}, "shared/gitea": {"shared/secretkey"}},
			transports, cores, []violation{{"shared/delivery", "shared/poolstatus"}}},
		{"every one, in order", map[string][]string{"shared/handler": {"shared/gitea", "shared/assignmentqueue"}, "shared/poolstatus": {"shared/gitea"}},
			cores, []string{"shared/assignmentqueue", "shared/gitea"},
			[]violation{{"shared/handler", "shared/gitea"}, {"shared/handler", "shared/assignmentqueue"}, {"shared/poolstatus", "shared/gitea"}}},
		{"only from's packages", map[string][]string{"functions/handle": {"shared/gitea", "shared/handler"}},
			cores, []string{"shared/gitea"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := violations(tc.deps, tc.from, tc.forbidden); !slices.Equal(got, tc.want) {
				t.Errorf("violations = %v, want %v", got, tc.want)
			}
		})
	}
}
