package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// conceptTypes are the concepts of docs/ARCHITECTURE.md's "Words" that name
// a Go type, and the packages (relative to the module; a pattern) allowed to
// declare an exported type of that name. A second meaning under one of these
// names (executor.Recoverer beside recoverer.Recoverer, a Backend interface
// beside executor.Backend) fails TestOneNamePerConcept.
var conceptTypes = map[string]*regexp.Regexp{
	// The one backend interface, and each backend's implementation of it.
	"Backend":   regexp.MustCompile(`^shared/(executor|backend/[a-z]+)$`),
	"Executor":  regexp.MustCompile(`^shared/executor$`),
	"Worker":    regexp.MustCompile(`^shared/executor$`),
	"Recoverer": regexp.MustCompile(`^shared/recoverer$`),
	"Handler":   regexp.MustCompile(`^shared/handler$`),
	"Runner":    regexp.MustCompile(`^shared/runner$`),
}

// exportedTypes returns, per exported type name, the packages under root's
// shared/ that declare it outside tests and generated code.
func exportedTypes(t *testing.T, root string) map[string][]string {
	t.Helper()
	types := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(root, "shared"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".gen.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, spec := range g.Specs {
				if name := spec.(*ast.TypeSpec).Name.Name; ast.IsExported(name) && !slices.Contains(types[name], filepath.ToSlash(rel)) {
					types[name] = append(types[name], filepath.ToSlash(rel))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return types
}

// misnamed returns "name in pkg" for every declaration types holds of a
// concept's name outside the packages allowed it.
func misnamed(types map[string][]string, concepts map[string]*regexp.Regexp) []string {
	var bad []string
	for name, allowed := range concepts {
		for _, pkg := range types[name] {
			if !allowed.MatchString(pkg) {
				bad = append(bad, name+" in "+pkg)
			}
		}
	}
	slices.Sort(bad)
	return bad
}

func TestOneNamePerConcept(t *testing.T) {
	types := exportedTypes(t, filepath.Join("..", ".."))
	if len(types["Backend"]) < 4 || len(types["Worker"]) != 1 {
		t.Fatalf("found Backend in %v and Worker in %v: the walk is wrong", types["Backend"], types["Worker"])
	}
	for _, m := range misnamed(types, conceptTypes) {
		t.Errorf("exported type %s: docs/ARCHITECTURE.md's Words give that name one meaning, elsewhere; name it for what it is", m)
	}
}

// The rule itself, on declarations as exportedTypes returns them.
func TestMisnamed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		types map[string][]string
		want  []string
	}{
		{"the backends and the interface", map[string][]string{"Backend": {"shared/executor", "shared/backend/pod", "shared/backend/process"}}, nil},
		{"a second Recoverer", map[string][]string{"Recoverer": {"shared/recoverer", "shared/executor"}}, []string{"Recoverer in shared/executor"}},
		{"a Backend interface in a core", map[string][]string{"Backend": {"shared/executor", "shared/recoverer"}}, []string{"Backend in shared/recoverer"}},
		{"a name that is no concept", map[string][]string{"Options": {"shared/a", "shared/b"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := misnamed(tc.types, conceptTypes); !slices.Equal(got, tc.want) {
				t.Errorf("misnamed = %v, want %v", got, tc.want)
			}
		})
	}
}
