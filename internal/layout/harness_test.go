package layout

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// harnessRoot is the folder of the harnesses: packages that start real peers
// (Gitea, NATS, SPIRE, a kube cluster, OpenSandbox...) for tests.
const harnessRoot = "internal/testenv"

// harnessContracts are the product packages a harness's tests may import: the
// wire contracts of the peers the harnesses stand up, which a harness test
// speaks to prove its peer answers as the product expects, and nothing the
// product decides with. Add one only for that reason, and say which harness
// needs it.
var harnessContracts = []string{
	"shared/assignmentqueue",                // jetstreamenv: the queue's stream, subjects and consumers
	"shared/assignmentsig",                  // jetstreamenv: the signed envelope on the queue
	"shared/secretkey",                      // jetstreamenv: the envelope's keys
	"shared/taskassignment",                 // jetstreamenv: the backends' names in the subjects
	"shared/metrics",                        // metricsenv: the registry it scrapes
	"shared/backend/opensandbox/sandboxapi", // opensandboxenv, batchsandboxenv: the lifecycle API the peer serves
}

// harnessMayImport reports whether a test of a harness package may import
// the module's package pkg (a path relative to the module): another harness,
// or one of harnessContracts.
func harnessMayImport(pkg string) bool {
	return pkg == harnessRoot || strings.HasPrefix(pkg, harnessRoot+"/") || slices.Contains(harnessContracts, pkg)
}

// TestHarnessTestsTestTheHarness keeps product tests out of the harness
// packages (internal/testenv and below). A harness package holds harnesses and
// the tests of the harness: that it starts its peer, and that the peer answers
// as the product expects. A test of the product lives beside what it tests
// (shared/backend/opensandbox for the OpenSandbox backend, functions/X for a
// function) or, for the cluster, in deploy (TestE2ECluster*). The rule checked:
// no _test.go file under internal/testenv, whatever its build constraint
// (e2e, none, or a tag added later: the files are parsed, not built), imports
// a package of the module other than a harness or one of harnessContracts. An import of
// functions/..., of a backend (shared/backend/... but sandboxapi) or of a core
// (shared/handler, shared/dispatcher...) makes a test one of the product. A
// product test that imports nothing of the product (as the shipped ScaledJob's
// under kedaenv was) is beyond this rule: that is judged by reading.
func TestHarnessTestsTestTheHarness(t *testing.T) {
	root := filepath.Join("..", "..")
	var files, tagged int
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(root, harnessRoot), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		files++
		if expr, err := buildConstraint(f); err != nil {
			return err
		} else if expr != nil {
			tagged++
		}
		rel, _ := filepath.Rel(root, path)
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			pkg, ours := strings.CutPrefix(p, module)
			if ours && !harnessMayImport(pkg) {
				t.Errorf("%s imports %s: a test of the product, not of the harness; move it beside what it tests, or to deploy (cluster tests)", filepath.ToSlash(rel), pkg)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk saw the harnesses' tests, the end-to-end ones (build tags) included.
	if files < 10 || tagged < 5 {
		t.Fatalf("found %d test files under %s, %d with build tags: the walk is wrong", files, harnessRoot, tagged)
	}
}

func TestHarnessMayImport(t *testing.T) {
	for pkg, want := range map[string]bool{
		"internal/testenv":                                     true,
		"internal/testenv/opensandboxenv":                      true,
		"shared/backend/opensandbox/sandboxapi":                true,
		"shared/assignmentqueue":                               true,
		"internal/testenvx":                                    false,
		"shared/backend/opensandbox":                           false,
		"shared/backend/opensandbox/sandboxapi/sandboxapitest": false,
		"shared/handler":                                       false,
		"functions/handle":                                     false,
		"internal/imagebuild":                                  false,
	} {
		if got := harnessMayImport(pkg); got != want {
			t.Errorf("harnessMayImport(%q) = %v, want %v", pkg, got, want)
		}
	}
}
