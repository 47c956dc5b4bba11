package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

var update = flag.Bool("update", false, "rewrite the generated files (make generate)")

const root = "../.."

// TestGeneratedIsCurrent: shared/backend/linked and the gdr_ build
// constraints are what the backend packages make of them.
func TestGeneratedIsCurrent(t *testing.T) {
	if *update {
		if err := write(root); err != nil {
			t.Fatal(err)
		}
	}
	out, err := generate(os.DirFS(root))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range out.Files {
		got, err := os.ReadFile(filepath.Join(root, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is stale (%v): run make generate", name, err)
		}
	}
	for _, name := range out.Stale {
		t.Errorf("%s is generated for no backend: run make generate", name)
	}
}

// TestEveryKnownKindIsABackend: the backend packages are the kinds the
// wire format knows (shared/taskassignment), no more, no fewer.
func TestEveryKnownKindIsABackend(t *testing.T) {
	kinds, err := discover(os.DirFS(root))
	if err != nil {
		t.Fatal(err)
	}
	var known []string
	for _, k := range taskassignment.BackendKinds() {
		known = append(known, string(k))
	}
	slices.Sort(known)
	if !slices.Equal(kinds, known) {
		t.Errorf("backend packages %v, known kinds %v", kinds, known)
	}
}

// TestConstraints: a file's on or off expression is rewritten for the
// kinds; one that names a gdr_ tag otherwise, or an unknown backend, is an
// error; a file without gdr_ is left alone.
func TestConstraints(t *testing.T) {
	kinds := []string{"a", "b"}
	for _, tt := range []struct {
		src, want, err string
	}{
		{src: "//go:build gdr_a || !(gdr_a)\n\npackage p\n", want: "//go:build gdr_a || !(gdr_a || gdr_b)\n\npackage p\n"},
		{src: "// Copyright\n\n//go:build !gdr_b && (gdr_a || gdr_c)\n\npackage p\n", want: "// Copyright\n\n//go:build !gdr_b && (gdr_a || gdr_b)\n\npackage p\n"},
		{src: "//go:build linux\n\npackage p\n"},
		{src: "//go:build gdr_a && linux\n\npackage p\n", err: "no backend's on or off expression"},
		{src: "//go:build gdr_c || !(gdr_c)\n\npackage p\n", err: "no backend c"},
		{src: "package p\n\n//go:build gdr_a || x\n"},
	} {
		files := map[string][]byte{}
		err := constraints(fstest.MapFS{"x/f.go": {Data: []byte(tt.src)}}, kinds, files)
		switch {
		case tt.err != "":
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: err = %v, want %q", tt.src, err, tt.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tt.src, err)
		case tt.want == "" && len(files) != 0, tt.want != "" && string(files["x/f.go"]) != tt.want:
			t.Errorf("%q: rewritten to %q, want %q", tt.src, files["x/f.go"], tt.want)
		}
	}
}

// TestAddingABackendRecipe follows docs/ADDING-A-BACKEND.md on the module
// as it is: its `// file:` blocks added, the kind added to
// shared/taskassignment and the settings embedded in BuildSettings (steps
// 1 and 2), the generator run; then the build with the new backend's tag
// links it alone, handle and recover compile, and neither links client-go.
// All in an overlay (go build -overlay): the checkout is not touched.
func TestAddingABackendRecipe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds handle and recover")
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs/ADDING-A-BACKEND.md"))
	if err != nil {
		t.Fatal(err)
	}
	fsys := fstest.MapFS{}
	if err := fs.WalkDir(os.DirFS(root), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && name != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
			return fs.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(name, ".go") {
			data, err := os.ReadFile(filepath.Join(root, name))
			fsys[name] = &fstest.MapFile{Data: data}
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	changed := map[string][]byte{}
	blocks := regexp.MustCompile("(?s)```go\n// file: ([^\n]+)\n(.*?)```").FindAllSubmatch(doc, -1)
	kind, settings := "", ""
	for _, b := range blocks {
		name := string(b[1])
		changed[name] = b[2]
		if dir, file := path.Split(name); dir == "shared/backend/" {
			settings = settingsType(t, name, b[2])
		} else if path.Dir(path.Clean(dir)) == "shared/backend" && file != "" {
			kind = path.Base(dir)
		}
	}
	if kind == "" || settings == "" {
		t.Fatalf("the recipe's blocks (%d) hold no backend package shared/backend/<kind>/ and no settings file shared/backend/settings_<kind>.go", len(blocks))
	}
	edit := func(name, old, new string) {
		src := string(fsys[name].Data)
		if !strings.Contains(src, old) {
			t.Fatalf("%s has no %q: update this test and the recipe's step", name, old)
		}
		changed[name] = []byte(strings.Replace(src, old, new, 1))
	}
	edit("shared/taskassignment/assignment.go", "var backends = []BackendKind{", "var backends = []BackendKind{"+`"`+kind+`", `)
	edit("shared/backend/backend.go", "type BuildSettings struct {\n", "type BuildSettings struct {\n\t"+settings+"\n")
	for name, data := range changed {
		fsys[name] = &fstest.MapFile{Data: data}
	}
	out, err := generate(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(slices.Collect(maps.Keys(out.Files)), "shared/backend/linked/"+kind+".go") {
		t.Fatalf("the generator did not find backend %s", kind)
	}
	for name, data := range out.Files {
		changed[name] = data
	}
	changed["shared/backend/linked/recipe_test.go"] = []byte(`package linked

import (
	"slices"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

func TestRecipeLinksTheNewBackendAlone(t *testing.T) {
	if got, want := Backends().Kinds(), []taskassignment.BackendKind{"` + kind + `"}; !slices.Equal(got, want) {
		t.Fatalf("Kinds = %v, want %v", got, want)
	}
	if err := Backends().Linked("pod"); err == nil {
		t.Fatal("pod linked")
	}
}
`)
	dir := t.TempDir()
	overlay := map[string]string{}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range changed {
		tmp := filepath.Join(dir, strings.ReplaceAll(name, "/", "_"))
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		overlay[filepath.Join(abs, filepath.FromSlash(name))] = tmp
	}
	for _, name := range out.Stale {
		overlay[filepath.Join(abs, filepath.FromSlash(name))] = ""
	}
	o, _ := json.Marshal(map[string]any{"Replace": overlay})
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, o, 0o600); err != nil {
		t.Fatal(err)
	}
	goCmd := func(args ...string) string {
		cmd := exec.Command("go", append([]string{args[0], "-overlay", overlayFile, "-tags", "gdr_" + kind}, args[1:]...)...)
		cmd.Dir = root
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	goCmd("test", "-count=1", "-vet=off", "-run", "^TestRecipeLinksTheNewBackendAlone$", "./shared/backend/linked/")
	goCmd("build", "./functions/handle/", "./functions/recover/")
	deps := strings.Fields(goCmd("list", "-deps", "./functions/handle/", "./functions/recover/"))
	if !slices.Contains(deps, module+"/shared/backend/"+kind) {
		t.Errorf("-tags gdr_%s: handle and recover do not link the new backend", kind)
	}
	for _, p := range []string{"k8s.io/client-go/kubernetes", module + "/shared/backend/pod", module + "/shared/backend/process"} {
		if slices.Contains(deps, p) {
			t.Errorf("-tags gdr_%s links %s", kind, p)
		}
	}
}

// settingsType is the name of the struct type the settings file declares.
func settingsType(t *testing.T, name string, src []byte) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
			for _, s := range g.Specs {
				if ts := s.(*ast.TypeSpec); strings.HasSuffix(ts.Name.Name, "Settings") {
					return ts.Name.Name
				}
			}
		}
	}
	t.Fatalf("%s declares no <Kind>Settings type", name)
	return ""
}
