package layout

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gitea-dynamic-runner/gitea-dynamic-runner/"

// The cores, transports and trigger adapters are the package map's
// (docs/ARCHITECTURE.md, its layer column): layer(t, layerCore) and so on.
// A core sees the queue, the Knative sink, Gitea and Kubernetes only through
// interfaces of its own, and sees no message at all: it returns a decision
// that a trigger adapter carries out (ack, nak, hold, terminate, answer), so
// that each core is tested with fakes and no transport decides what a
// message means. A transport never depends on a core or an adapter: they
// are wired together by a function's main, never the other way round.

// forbiddenForCores are the transports a core must not link, even through
// another package. The others are what cores are built on (assignmentsig's
// envelopes in handle's core); each name here must be a transport of the
// package map. Every trigger adapter is forbidden to the cores too.
var forbiddenForCores = []string{"shared/assignmentqueue", "shared/assignmentevents", "shared/gitea"}

// modulesForbiddenForCores are the clients of the queue, the Knative path
// and Kubernetes: no core links a package of these modules, even through
// another package (nats.go's jetstream is below nats.go).
var modulesForbiddenForCores = []string{"github.com/nats-io/nats.go", "github.com/cloudevents/sdk-go", "k8s.io/client-go"}

// violation is package Pkg linking Dep, which a rule forbids it.
type violation struct{ Pkg, Dep string }

// violations returns every (p, d) with p in from and d one of forbidden, or
// a package below one, among p's dependencies in deps, in from's order, then
// deps[p]'s. deps holds each package's dependencies, indirect ones included
// (as linked gives them), so an import through another package is caught as
// a direct one is.
func violations(deps map[string][]string, from, forbidden []string) []violation {
	var vs []violation
	for _, p := range from {
		for _, d := range deps[p] {
			if slices.ContainsFunc(forbidden, func(f string) bool { return d == f || strings.HasPrefix(d, f+"/") }) {
				vs = append(vs, violation{Pkg: p, Dep: d})
			}
		}
	}
	return vs
}

// linked returns, for each of pkgs, the packages it links, directly or not
// (go list's Deps, the set -deps lists; itself excluded): the module's own
// as paths relative to the module, the others' as they are (standard
// library included). A package go list does not report fails t,
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
		all := []string{}
		for _, d := range f[1:] {
			if rel, ok := strings.CutPrefix(d, module); ok {
				if rel != pkg {
					all = append(all, rel)
				}
				continue
			}
			all = append(all, d)
		}
		deps[pkg] = all
	}
	for _, p := range pkgs {
		if _, ok := deps[p]; !ok {
			t.Fatalf("go list did not report %s", p)
		}
	}
	return deps
}

func TestCoresSeeNoTransport(t *testing.T) {
	cores, transports, triggers := layer(t, layerCore), layer(t, layerTransport), layer(t, layerTrigger)
	for _, f := range forbiddenForCores {
		if !slices.Contains(transports, f) {
			t.Errorf("forbiddenForCores names %s, which docs/ARCHITECTURE.md's package map does not call a transport", f)
		}
	}
	forbidden := slices.Concat(forbiddenForCores, triggers, modulesForbiddenForCores)
	for _, v := range violations(linked(t, cores), cores, forbidden) {
		t.Errorf("core %s links %s; declare what it needs as an interface of its own (or in shared/taskassignment), and leave the message to its trigger adapter", v.Pkg, v.Dep)
	}
}

func TestTransportsLinkNoCore(t *testing.T) {
	cores, transports, triggers := layer(t, layerCore), layer(t, layerTransport), layer(t, layerTrigger)
	for _, v := range violations(linked(t, transports), transports, slices.Concat(cores, triggers)) {
		t.Errorf("transport %s links core or trigger adapter %s", v.Pkg, v.Dep)
	}
}

// The rule itself, fed dependency lists as linked returns them: a forbidden
// package is caught whether imported directly or through another, and only
// from the packages the rule is about.
func TestViolations(t *testing.T) {
	cores := []string{"shared/handler", "shared/poolstatus"}
	transports := []string{"shared/gitea", "shared/webhook"}
	for _, tc := range []struct {
		name      string
		deps      map[string][]string
		from      []string
		forbidden []string
		want      []violation
	}{
		{"clean", map[string][]string{"shared/handler": {"shared/taskassignment", "shared/webhook"}},
			cores, []string{"shared/gitea"}, nil},
		{"core imports a forbidden transport", map[string][]string{"shared/handler": {"shared/taskassignment", "shared/gitea"}},
			cores, []string{"shared/gitea"}, []violation{{"shared/handler", "shared/gitea"}}},
		{"through another package", map[string][]string{"shared/poolstatus": {"shared/executor", "shared/gitea", "shared/taskassignment"}},
			cores, []string{"shared/gitea"}, []violation{{"shared/poolstatus", "shared/gitea"}}},
		{"transport links a core", map[string][]string{"shared/webhook": {"shared/poolstatus"}, "shared/gitea": {"shared/secretkey"}},
			transports, cores, []violation{{"shared/webhook", "shared/poolstatus"}}},
		{"every one, in order", map[string][]string{"shared/handler": {"shared/gitea", "shared/assignmentqueue"}, "shared/poolstatus": {"shared/gitea"}},
			cores, []string{"shared/assignmentqueue", "shared/gitea"},
			[]violation{{"shared/handler", "shared/gitea"}, {"shared/handler", "shared/assignmentqueue"}, {"shared/poolstatus", "shared/gitea"}}},
		{"only from's packages", map[string][]string{"functions/handle": {"shared/gitea", "shared/handler"}},
			cores, []string{"shared/gitea"}, nil},
		{"a package below a forbidden module", map[string][]string{"shared/handler": {"context", "github.com/nats-io/nats.go/jetstream"}},
			cores, modulesForbiddenForCores, []violation{{"shared/handler", "github.com/nats-io/nats.go/jetstream"}}},
		{"a name that only starts like a forbidden one", map[string][]string{"shared/handler": {"github.com/nats-io/nats.go-extra"}},
			cores, modulesForbiddenForCores, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := violations(tc.deps, tc.from, tc.forbidden); !slices.Equal(got, tc.want) {
				t.Errorf("violations = %v, want %v", got, tc.want)
			}
		})
	}
}
