package layout

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layers are the package map's layer names (its second column), in the
// map's order. A line naming any other layer fails packageMap, so a typo
// cannot drop a package out of the rules the layers carry.
var layers = []string{"contract", "transport", "core", "trigger", "executor", "backend", "runner", "edge"}

// The layers the import rules (imports_test.go) are about.
const (
	layerCore      = "core"
	layerTransport = "transport"
	layerTrigger   = "trigger"
)

// mapLine is one line of the package map: a package (relative to the
// module) and its layer.
type mapLine struct {
	Path, Layer string
}

// packageMap returns the lines of docs/ARCHITECTURE.md's code block under
// "## Packages": each line's first word (the package) and second (its
// layer, one of layers).
func packageMap(t *testing.T, doc string) []mapLine {
	t.Helper()
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	var lines []mapLine
	inSection, inBlock := false, false
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			inSection = line == "## Packages"
		case inSection && strings.HasPrefix(line, "```"):
			if inBlock {
				return lines
			}
			inBlock = true
		case inSection && inBlock && strings.TrimSpace(line) != "":
			f := strings.Fields(line)
			if len(f) < 2 || !slices.Contains(layers, f[1]) {
				t.Fatalf("docs/ARCHITECTURE.md's package map: line %q names no layer (want one of %s)", line, strings.Join(layers, ", "))
			}
			lines = append(lines, mapLine{Path: f[0], Layer: f[1]})
		}
	}
	t.Fatal("docs/ARCHITECTURE.md has no code block under ## Packages")
	return nil
}

// layer returns the packages the package map puts in layer name; none
// fails t.
func layer(t *testing.T, name string) []string {
	t.Helper()
	var paths []string
	for _, l := range packageMap(t, filepath.Join("..", "..", "docs", "ARCHITECTURE.md")) {
		if l.Layer == name {
			paths = append(paths, l.Path)
		}
	}
	if len(paths) == 0 {
		t.Fatalf("docs/ARCHITECTURE.md's package map has no package in layer %s", name)
	}
	return paths
}

func TestPackageMapListsEveryPackage(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-f", "{{.Dir}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var packages []string
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		packages = append(packages, filepath.ToSlash(rel))
	}
	var listed []string
	for _, l := range packageMap(t, filepath.Join(root, "docs", "ARCHITECTURE.md")) {
		listed = append(listed, l.Path)
	}
	for _, p := range packages {
		if !slices.Contains(listed, p) {
			t.Errorf("package %s is not in docs/ARCHITECTURE.md's package map", p)
		}
	}
	for _, l := range listed {
		if !slices.Contains(packages, l) {
			t.Errorf("docs/ARCHITECTURE.md's package map lists %s, which is not a package", l)
		}
	}
}
