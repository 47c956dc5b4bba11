package layout

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// link is one relative link of a Markdown file: its target path (empty
// for the file itself) and anchor (empty for none), and where it is.
type link struct {
	Path, Anchor string
	Line         int
}

var (
	// inlineLink is [text](target) or ![alt](target), its text on one or
	// more lines, target without spaces (a title after it is allowed).
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// linkText is a link in a heading, for its text.
	linkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	// refDef is a reference definition: [label]: target.
	refDef = regexp.MustCompile(`(?m)^[ \t]{0,3}\[[^\]]+\]:\s+(\S+)`)
	// codeSpan is inline code, whose brackets are not links.
	codeSpan = regexp.MustCompile("`[^`]*`")
	// headingLine is an ATX heading.
	headingLine = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	// notSlug is what GitHub drops from a heading's text to make its
	// anchor: anything but letters, digits, spaces, hyphens and
	// underscores.
	notSlug = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// parseMarkdown returns the relative links of a Markdown text and the
// anchors of its headings (GitHub's: lowercased, punctuation dropped, spaces
// to hyphens, a repeat suffixed -1, -2, ...). Fenced code blocks hold
// neither; inline code holds no link; a link's text may span lines.
func parseMarkdown(text string) (links []link, anchors map[string]bool) {
	anchors = map[string]bool{}
	seen := map[string]int{}
	fence := ""
	var prose []string // text's lines, those of code blocks and inline code blanked
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			line = ""
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			line = ""
		}
		if m := headingLine.FindStringSubmatch(line); m != nil {
			title := codeSpan.ReplaceAllStringFunc(m[2], func(s string) string { return strings.Trim(s, "`") })
			title = linkText.ReplaceAllString(title, "$1")
			slug := strings.ReplaceAll(notSlug.ReplaceAllString(strings.ToLower(title), ""), " ", "-")
			if k := seen[slug]; k > 0 {
				anchors[fmt.Sprintf("%s-%d", slug, k)] = true
			} else {
				anchors[slug] = true
			}
			seen[slug]++
		}
		prose = append(prose, codeSpan.ReplaceAllStringFunc(line, func(s string) string { return strings.Repeat(" ", len(s)) }))
	}
	joined := strings.Join(prose, "\n")
	add := func(target string, at int) {
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			return
		}
		path, anchor, _ := strings.Cut(target, "#")
		links = append(links, link{Path: path, Anchor: anchor, Line: 1 + strings.Count(joined[:at], "\n")})
	}
	for _, m := range inlineLink.FindAllStringSubmatchIndex(joined, -1) {
		add(joined[m[2]:m[3]], m[0])
	}
	for _, m := range refDef.FindAllStringSubmatchIndex(joined, -1) {
		add(joined[m[2]:m[3]], m[0])
	}
	slices.SortStableFunc(links, func(a, b link) int { return a.Line - b.Line })
	return links, anchors
}

// TestMarkdownLinksResolve: every relative link of every Markdown file of
// the module names a file or folder that exists, and its anchor, if any, a
// heading of that Markdown file.
func TestMarkdownLinksResolve(t *testing.T) {
	root := filepath.Join("..", "..")
	cmd := exec.Command("git", "ls-files", "*.md")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	files := strings.Fields(string(out))
	if !slices.Contains(files, "README.md") || len(files) < 10 {
		t.Fatalf("found %v: the walk is wrong", files)
	}
	anchorsOf := map[string]map[string]bool{}
	parsed := map[string][]link{}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		parsed[f], anchorsOf[f] = parseMarkdown(string(data))
	}
	checked := 0
	for _, f := range files {
		for _, l := range parsed[f] {
			target := f
			if l.Path != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(f), l.Path)))
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					t.Errorf("%s:%d links %s, which does not exist", f, l.Line, l.Path)
					continue
				}
			}
			checked++
			if l.Anchor == "" {
				continue
			}
			anchors, ok := anchorsOf[target]
			if !ok {
				continue // an anchor into a file that is not Markdown (a line of code)
			}
			if !anchors[l.Anchor] {
				t.Errorf("%s:%d links %s#%s: no such heading there", f, l.Line, l.Path, l.Anchor)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked %d links: the parse is wrong", checked)
	}
}

// The parser itself: what it takes for a link and an anchor.
func TestParseMarkdown(t *testing.T) {
	text := "# Top `code` title\n\n## Pools: the file\n\n## Pools: the file\n\n" +
		"See [a](docs/A.md#x), ![i](img.png), `[not](a link)`, [web](https://example.org/x).\n" +
		"```\n[in code](nope.md)\n# not a heading\n```\n" +
		"[ref]: ../B.md#pools-the-file\n[self](#top-code-title), [two\nlines](C.md#y)\n"
	links, anchors := parseMarkdown(text)
	want := []link{{"docs/A.md", "x", 7}, {"img.png", "", 7}, {"../B.md", "pools-the-file", 12}, {"", "top-code-title", 13}, {"C.md", "y", 13}}
	if !slices.Equal(links, want) {
		t.Errorf("links = %+v, want %+v", links, want)
	}
	for _, a := range []string{"top-code-title", "pools-the-file", "pools-the-file-1"} {
		if !anchors[a] {
			t.Errorf("anchor %q missing from %v", a, anchors)
		}
	}
	if anchors["not-a-heading"] {
		t.Error("a heading in a code block counted")
	}
}

// runbookBase is where the alerts' runbook_url points: docs/OPERATIONS.md on the project's main
// branch, by the module's path.
const runbookBase = "https://github.com/gitea-dynamic-runner/gitea-dynamic-runner/blob/main/docs/OPERATIONS.md#"

// TestAlertRunbooksResolve: every alert of the shipped rules has a runbook_url, and it names the
// heading of docs/OPERATIONS.md that is the alert's own (its name, lowercased).
func TestAlertRunbooksResolve(t *testing.T) {
	root := filepath.Join("..", "..")
	data, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "gitea-dynamic-runner", "files", "gitea-dynamic-runner-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert       string            `json:"alert"`
					Annotations map[string]string `json:"annotations"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &rule); err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile(filepath.Join(root, "docs", "OPERATIONS.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, anchors := parseMarkdown(string(ops))
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, runbookBase)
			switch {
			case !ok:
				t.Errorf("alert %s: runbook_url %q is not %s<its heading>", r.Alert, url, runbookBase)
			case anchor != strings.ToLower(r.Alert):
				t.Errorf("alert %s: runbook_url names #%s, not its own heading #%s", r.Alert, anchor, strings.ToLower(r.Alert))
			case !anchors[anchor]:
				t.Errorf("alert %s: docs/OPERATIONS.md has no heading #%s", r.Alert, anchor)
			}
		}
	}
	if alerts < 5 {
		t.Fatalf("found %d alerts: the parse is wrong", alerts)
	}
}
