package layout

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// testName is a test named in prose: TestX, TestX/Subtest (the function is TestX), or TestX*
// (some test whose name starts TestX).
var testName = regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9_]*\*?`)

// testFuncs returns the names of every Test function declared in the module's _test.go files.
func testFuncs(t *testing.T, root string) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]*)\(`)
	found := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(data), -1) {
			found[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestSecurityClaimsNameRealTests: every test the security claims cite (docs/SECURITY.md, and
// README.md's security table) is a test of the module, so no claim rests on a test that is gone
// or was never written.
func TestSecurityClaimsNameRealTests(t *testing.T) {
	root := filepath.Join("..", "..")
	funcs := testFuncs(t, root)
	if len(funcs) < 100 {
		t.Fatalf("found %d test functions in the module: the walk is wrong", len(funcs))
	}
	for _, doc := range []string{"docs/SECURITY.md", "README.md"} {
		data, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		cited := testName.FindAllString(string(data), -1)
		if len(cited) == 0 {
			t.Errorf("%s cites no test", doc)
		}
		for _, name := range cited {
			if !declared(funcs, name) {
				t.Errorf("%s cites %s, which no _test.go declares", doc, name)
			}
		}
	}
}

func declared(funcs map[string]bool, name string) bool {
	prefix, glob := strings.CutSuffix(name, "*")
	if !glob {
		return funcs[name]
	}
	for f := range funcs {
		if strings.HasPrefix(f, prefix) {
			return true
		}
	}
	return false
}
