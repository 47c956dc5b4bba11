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

// packageMap returns the first word of every line of docs/ARCHITECTURE.md's
// code block under "## Packages".
func packageMap(t *testing.T, doc string) []string {
	t.Helper()
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	inSection, inBlock := false, false
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			inSection = line == "## Packages"
		case inSection && strings.HasPrefix(line, "```"):
			if inBlock {
				return paths
			}
			inBlock = true
		case inSection && inBlock && strings.TrimSpace(line) != "":
			paths = append(paths, strings.Fields(line)[0])
		}
	}
	t.Fatal("docs/ARCHITECTURE.md has no code block under ## Packages")
	return nil
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
	listed := packageMap(t, filepath.Join(root, "docs", "ARCHITECTURE.md"))
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
