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

// readmeLayout returns the first word of every line of README.md's code
// block under "## Layout".
func readmeLayout(t *testing.T, readme string) []string {
	t.Helper()
	data, err := os.ReadFile(readme)
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
			inSection = line == "## Layout"
		case inSection && strings.HasPrefix(line, "```"):
			if inBlock {
				return paths
			}
			inBlock = true
		case inSection && inBlock && strings.TrimSpace(line) != "":
			paths = append(paths, strings.Fields(line)[0])
		}
	}
	t.Fatal("README.md has no code block under ## Layout")
	return nil
}

func TestREADMEListsEveryPackage(t *testing.T) {
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
	listed := readmeLayout(t, filepath.Join(root, "README.md"))
	for _, p := range packages {
		if !slices.Contains(listed, p) {
			t.Errorf("package %s is not in README.md's layout section", p)
		}
	}
	for _, l := range listed {
		if !slices.Contains(packages, l) {
			t.Errorf("README.md's layout lists %s, which is not a package", l)
		}
	}
}
