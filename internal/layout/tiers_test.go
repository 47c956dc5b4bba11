package layout

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// e2eTag is the build tag of the end-to-end tier (docs/TESTING.md).
const e2eTag = "e2e"

// makeE2ETag reports whether `make e2e` sets tag when it builds the tests on
// this project's machines (linux/amd64 or linux/arm64, the gc toolchain): e2e
// and what the toolchain sets by itself. A file that also asks for another
// tag (a tier of its own, as opensandboxk8s was) is left out of `make e2e`.
func makeE2ETag(tag string) bool {
	switch tag {
	case e2eTag, "linux", "unix", "amd64", "arm64", "gc", "cgo":
		return true
	}
	return strings.HasPrefix(tag, "go1.")
}

// e2eTier classifies a test file's build constraint: whether the file
// belongs to the end-to-end tier (it names e2e, and a build without e2e
// leaves it out: "!e2e" is the unit tier's), and whether `make e2e`
// (makeE2ETag) builds it.
func e2eTier(expr constraint.Expr) (inTier, built bool) {
	var mentions bool
	withoutE2E := expr.Eval(func(tag string) bool {
		if tag == e2eTag {
			mentions = true
			return false
		}
		return makeE2ETag(tag)
	})
	return mentions && !withoutE2E, expr.Eval(makeE2ETag)
}

// makeE2ERun returns the -run pattern of the Makefile's e2e target: the
// filter every end-to-end test's name must match to run in `make e2e`.
func makeE2ERun(t *testing.T, makefile string) *regexp.Regexp {
	t.Helper()
	data, err := os.ReadFile(makefile)
	if err != nil {
		t.Fatal(err)
	}
	_, target, ok := strings.Cut(string(data), "\ne2e:")
	if !ok {
		t.Fatalf("%s has no e2e target", makefile)
	}
	target, _, _ = strings.Cut(target, "\n\n")
	m := regexp.MustCompile(`test -tags e2e .*-run '([^']+)'`).FindStringSubmatch(target)
	if m == nil {
		t.Fatalf("%s: the e2e target runs no `go test -tags e2e ... -run '...'`", makefile)
	}
	return regexp.MustCompile(m[1])
}

// TestE2ETestsRunInMakeE2E keeps every end-to-end test in `make e2e`, the
// tier CI runs: a _test.go file of the e2e tier (e2eTier) is built
// with the tags `make e2e` sets (no second tag a separate target would have
// to set), and each of its tests (TestMain aside) has a name the e2e
// target's -run pattern, read from the Makefile, selects.
func TestE2ETestsRunInMakeE2E(t *testing.T) {
	root := filepath.Join("..", "..")
	run := makeE2ERun(t, filepath.Join(root, "Makefile"))
	fset := token.NewFileSet()
	var files, tests int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		expr, err := buildConstraint(f)
		if err != nil || expr == nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		inTier, built := e2eTier(expr)
		if !inTier {
			return nil
		}
		files++
		if !built {
			t.Errorf("%s: //go:build %s: `make e2e` (tags %s) does not build it", rel, expr, e2eTag)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
				continue
			}
			tests++
			if !run.MatchString(fn.Name.Name) {
				t.Errorf("%s: %s: `make e2e` runs -run %q, which does not select it", rel, fn.Name.Name, run)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk saw the end-to-end tier (68 files and more than 100 tests when
	// this rule was written).
	if files < 50 || tests < 80 {
		t.Fatalf("found %d e2e test files with %d tests: the walk is wrong", files, tests)
	}
}

// buildConstraint returns f's //go:build expression, nil when it has none.
func buildConstraint(f *ast.File) (constraint.Expr, error) {
	for _, g := range f.Comments {
		for _, c := range g.List {
			if c.Pos() < f.Package && constraint.IsGoBuild(c.Text) {
				expr, err := constraint.Parse(c.Text)
				if err != nil {
					return nil, err
				}
				return expr, nil
			}
		}
	}
	return nil, nil
}

func TestE2ETier(t *testing.T) {
	for _, tc := range []struct {
		line           string
		inTier, builds bool
	}{
		{"//go:build e2e", true, true},
		{"//go:build e2e && linux", true, true},
		{"//go:build e2e && opensandboxk8s", true, false},
		{"//go:build e2e || chaosgitea", true, true},
		{"//go:build !e2e", false, false},
		{"//go:build e2e || !race", false, true},
		{"//go:build chaosgitea", false, false},
		{"//go:build !race", false, true},
	} {
		expr, err := constraint.Parse(tc.line)
		if err != nil {
			t.Fatal(err)
		}
		inTier, builds := e2eTier(expr)
		if inTier != tc.inTier || builds != tc.builds {
			t.Errorf("%s: in the e2e tier %v, built by make e2e %v; want %v, %v", tc.line, inTier, builds, tc.inTier, tc.builds)
		}
	}
}

func TestMakeE2ERun(t *testing.T) {
	run := makeE2ERun(t, filepath.Join("..", "..", "Makefile"))
	for name, want := range map[string]bool{
		"TestE2EOpenSandboxKubernetesJobs": true,
		"TestE2EBusyboxLayerHasAShell":     true,
		"TestBusyboxLayerHasAShell":        false,
	} {
		if got := run.MatchString(name); got != want {
			t.Errorf("make e2e's -run %q selects %s: %v, want %v", run, name, got, want)
		}
	}
}
