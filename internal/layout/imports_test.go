package layout

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gitea-dynamic-runner/gitea-dynamic-runner/"

// cores are the three functions' cores: they see the queue, the Knative
// sink and Gitea only through interfaces of their own, so that each is
// tested with fakes and no transport decides what they mean.
var cores = []string{"shared/dispatcher", "shared/handler", "shared/recoverer"}

// transports carry assignments, notices and reports between the functions,
// Gitea and the executors. None may depend on a core: a core is wired to a
// transport by a function's main, never the other way round.
var transports = []string{
	"shared/assignmentqueue", "shared/assignmentevents", "shared/gitea", "shared/gateway",
	"shared/natsconn", "shared/webhook", "shared/delivery",
}

// forbiddenForCores are the transports a core must not link, even through
// another package.
var forbiddenForCores = []string{"shared/assignmentqueue", "shared/assignmentevents", "shared/gitea"}

// deps lists the module's own packages pkg links (itself excluded), as
// paths relative to the module.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./"+pkg)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	var own []string
	for _, p := range strings.Fields(string(out)) {
		if rel, ok := strings.CutPrefix(p, module); ok && rel != pkg {
			own = append(own, rel)
		}
	}
	return own
}

func TestCoresSeeNoTransport(t *testing.T) {
	for _, core := range cores {
		for _, d := range deps(t, core) {
			if slices.Contains(forbiddenForCores, d) {
				t.Errorf("core %s links %s; declare what it needs as an interface of its own (or in shared/taskassignment)", core, d)
			}
		}
	}
}

func TestTransportsLinkNoCore(t *testing.T) {
	for _, tr := range transports {
		for _, d := range deps(t, tr) {
			if slices.Contains(cores, d) {
				t.Errorf("transport %s links core %s", tr, d)
			}
		}
	}
}
