package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"mvdan.cc/sh/v3/syntax"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// README.md's install is run as written: each ```sh block of the sections below carries a
// marker comment on the line before it,
//
//	<!-- readme-test: PHASE NAME -->
//
// where PHASE is variables (the one block of documented variables), install, upgrade or
// uninstall (TestE2EClusterReadme runs the block in that phase, in order, by NAME), build
// (TestE2EClusterBuild runs it, by NAME), docker (TestE2EClusterDocker runs it, by NAME), helm
// (TestE2EClusterHelmBuiltinIdentity runs it, by NAME), or
// `skip: <why>` (a prerequisite the test provides itself, saying how).
const readmeMarker = "<!-- readme-test: "

// readmeSections are the sections whose every sh block must carry a marker.
var readmeSections = []string{"## Prerequisites", "## Install from an empty cluster (KEDA)", "## Upgrade (KEDA)", "## Uninstall (KEDA)",
	"## Helm", "## Image builds", "## Docker workflows"}

// readmeBlock is one fenced sh block of README.md.
type readmeBlock struct {
	file    string // the Markdown file it is in, relative to deploy/
	section string // the "## " heading it is under
	phase   string // variables, install, upgrade, uninstall, skip; "" without a marker
	name    string // its name in its phase, or why it is skipped
	text    string // the block's lines, the fence's indentation removed
	line    int    // the line of its opening fence, from 1
}

// readmeBlocks returns every ```sh block of README.md, in order.
func readmeBlocks(t testing.TB) []readmeBlock {
	t.Helper()
	return docBlocks(t, "README.md", readmeMarker)
}

// docBlocks returns every ```sh block of the Markdown file path, in order, each with the marker
// (a comment line starting with marker, such as readmeMarker) on the line before it parsed into
// its phase and name.
func docBlocks(t testing.TB, path, prefix string) []readmeBlock {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []readmeBlock
	var section, marker string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "## "):
			section, marker = line, ""
		case strings.HasPrefix(trimmed, prefix):
			marker = strings.TrimSuffix(strings.TrimPrefix(trimmed, prefix), " -->")
		case trimmed == "```sh":
			indent := line[:len(line)-len(strings.TrimLeft(line, " "))]
			b := readmeBlock{file: path, section: section, line: n}
			phase, name, _ := strings.Cut(marker, " ")
			b.phase, b.name = phase, name
			if strings.HasPrefix(marker, "skip:") {
				b.phase, b.name = "skip", strings.TrimSpace(strings.TrimPrefix(marker, "skip:"))
			}
			var body []string
			for sc.Scan() {
				n++
				l := sc.Text()
				if strings.TrimSpace(l) == "```" {
					break
				}
				body = append(body, strings.TrimPrefix(l, indent))
			}
			b.text = strings.Join(body, "\n") + "\n"
			out = append(out, b)
			marker = ""
		case trimmed != "":
			marker = "" // a marker belongs to the block right after it
		}
	}
	return out
}

// readmePhase returns the blocks of phase, in order.
func readmePhase(t testing.TB, phase string) []readmeBlock {
	t.Helper()
	var out []readmeBlock
	for _, b := range readmeBlocks(t) {
		if b.phase == phase {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		t.Fatalf("README.md has no block marked readme-test: %s", phase)
	}
	return out
}

// readmeVariables returns the names the variables block documents (NAME=value lines), in order.
func readmeVariables(t testing.TB) []string {
	t.Helper()
	blocks := readmePhase(t, "variables")
	if len(blocks) != 1 {
		t.Fatalf("README.md has %d variables blocks, want 1", len(blocks))
	}
	var names []string
	for _, line := range strings.Split(blocks[0].text, "\n") {
		if m := assignment.FindStringSubmatch(line); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

var (
	assignment  = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)=`)
	placeholder = regexp.MustCompile(`<[A-Za-z][A-Za-z0-9 _-]*>`)
	// exampleValue is a value the docs mark for replacing: PLACEHOLDER, or a host of the
	// example domains.
	exampleValue = regexp.MustCompile(`PLACEHOLDER|[A-Za-z0-9.-]*\bexample\.(?:com|org|net)\b|ghcr\.io/example\b`)
	// shippedPlaceholders are the two ways a block may name the shipped manifests'
	// placeholders without being one: the placeholder images' names, which the overlay
	// replaces (a sed pattern, kustomize's images), and a grep for what is left.
	shippedPlaceholders = regexp.MustCompile(`ghcr\.io/example/(?:\\\(|\$f\b|gitea-dynamic-runner-)|grep -n 'PLACEHOLDER'`)
	// fileRef matches a path of this repository a block names.
	fileRef = regexp.MustCompile(`(?:^|[\s=\[,'"(])(?:\.\./|\./)?((?:deploy|functions|shared|internal)/[A-Za-z0-9_./-]*[A-Za-z0-9_])`)
)

// readmeNames are the blocks TestE2EClusterReadme runs, and hooks into, by name.
var readmeNames = map[string][]string{
	"install":   {"keys", "nats-users", "registration-token", "gitea-token", "gitea-read-token", "images", "overlay", "register", "spire-entries", "apply", "webhook", "check"},
	"upgrade":   {"images", "verify-both", "apply", "sign-new", "verify-new"},
	"uninstall": {"all"},
	"build":     {"seccomp", "namespace"},                                                               // TestE2EClusterBuild's
	"docker":    {"namespace"},                                                                          // TestE2EClusterDocker's
	"helm":      {"registration-token", "gitea-read-token", "install", "check", "upgrade", "uninstall"}, // TestE2EClusterHelmBuiltinIdentity's
}

// TestReadmeBlocks checks README.md's install, upgrade and uninstall as the commands
// TestE2EClusterReadme runs: every sh block of those sections and of the prerequisites is
// marked (run in a phase, or skipped saying why); the run blocks are exactly the named ones
// the test knows, in order; each parses (bash -n); none holds a <placeholder>, PLACEHOLDER or an
// example host (a value the reader must replace, where the test would run it as written); every variable
// a block uses is documented in the variables block or set by the block itself, and every
// documented one is used; and every file of this repository a block names exists.
func TestReadmeBlocks(t *testing.T) {
	documented := readmeVariables(t)
	blocks := readmeBlocks(t)
	got := map[string][]string{}
	usedVars := map[string]bool{}
	for _, b := range blocks {
		if !slices.Contains(readmeSections, b.section) {
			if b.phase != "" {
				t.Errorf("README.md:%d: a readme-test marker outside %q", b.line, readmeSections)
			}
			continue
		}
		where := fmt.Sprintf("%s (README.md:%d)", b.section, b.line)
		switch b.phase {
		case "skip":
			if b.name == "" {
				t.Errorf("%s: skipped without saying why", where)
			}
			continue
		case "variables":
			continue
		case "install", "upgrade", "uninstall", "build", "docker", "helm":
			got[b.phase] = append(got[b.phase], b.name)
		case "":
			t.Errorf("%s: an sh block without a readme-test marker", where)
			continue
		default:
			t.Errorf("%s: unknown phase %q", where, b.phase)
			continue
		}
		if out, err := exec.Command("bash", "-n", "-c", b.text).CombinedOutput(); err != nil { // the real parser too
			t.Errorf("%s %s: bash -n: %v\n%s", where, b.name, err, out)
		}
		if p := placeholder.FindString(b.text); p != "" {
			t.Errorf("%s %s: placeholder %s", where, b.name, p)
		}
		if p := exampleValue.FindString(shippedPlaceholders.ReplaceAllString(b.text, "")); p != "" {
			t.Errorf("%s %s: %s, a value to replace, in a block run as written (values belong in the variables block)", where, b.name, p)
		}
		f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(b.text), b.name)
		if err != nil {
			t.Errorf("%s %s: %v", where, b.name, err)
			continue
		}
		own, uses, _ := shellNames(f)
		for name := range uses {
			usedVars[name] = true
			if !own[name] && !slices.Contains(documented, name) {
				t.Errorf("%s %s: $%s is neither documented in the variables block nor set by the block", where, b.name, name)
			}
		}
		for _, m := range fileRef.FindAllStringSubmatch(b.text, -1) {
			if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
				t.Errorf("%s %s: names %s, which does not exist", where, b.name, m[1])
			}
		}
	}
	for _, name := range documented {
		if !usedVars[name] {
			t.Errorf("the variables block documents %s, which no block uses", name)
		}
	}
	for phase, want := range readmeNames {
		if !slices.Equal(got[phase], want) {
			t.Errorf("%s blocks %q, want %q (TestE2EClusterReadme runs and hooks into them by name)", phase, got[phase], want)
		}
	}
}

// TestReadmeOverlaySetsEveryValue runs README.md's install block "overlay" as written, with
// sample variables, beside this deploy folder, and builds the overlay with kustomize's Go API:
// every value must land where the functions read it, no placeholder may be left, the pools
// file register reads (my-deploy/pools.yaml) must be the gdr-pools ConfigMap's, byte for byte,
// and every object must stay in its namespace with its RBAC subjects.
func TestReadmeOverlaySetsEveryValue(t *testing.T) {
	root := t.TempDir()
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(here, filepath.Join(root, "deploy")); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"REG": "registry.test/ci", "TAG": "v9", "TD": "ci.test", "CLUSTER": "c-7", "GITEA": "https://git.test/",
		"SPIRE": "spire.test:8081", "NATS": "nats://n.test:4222", "NATS_MONITOR": "n.test:8222", "NATS_REPLICAS": "5",
	}
	var overlay readmeBlock
	for _, b := range readmePhase(t, "install") {
		if b.name == "overlay" {
			overlay = b
		}
	}
	c := exec.Command("bash", "-euo", "pipefail", "-c", overlay.text)
	c.Dir, c.Env = root, os.Environ()
	for k, v := range env {
		c.Env = append(c.Env, k+"="+v)
	}
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("the overlay block: %v\n%s", err, out)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(root, "my-deploy"))
	if err != nil {
		t.Fatalf("kustomize build my-deploy: %v", err)
	}
	built, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	for _, left := range []string{"ghcr.io/example/", "nats.nats.svc", "gitea.example.com", "example.org", "example-cluster", "spire-server.spire"} {
		if bytes.Contains(built, []byte(left)) {
			t.Errorf("the overlay's build still names %q", left)
		}
	}
	file, err := os.ReadFile(filepath.Join(root, "my-deploy", "pools.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var parsed map[string]any
	if err := yaml.UnmarshalStrict(file, &parsed); err != nil || len(parsed) == 0 {
		t.Fatalf("my-deploy/pools.yaml does not parse: %v", err)
	}
	for _, r := range m.Resources() {
		if ns := r.GetNamespace(); r.GetKind() != "ClusterRole" && r.GetKind() != "ClusterRoleBinding" && !strings.HasPrefix(ns, installNamespace) {
			t.Errorf("%s %s in namespace %q, want %s or its executors' namespace", r.GetKind(), r.GetName(), ns, installNamespace)
		}
		switch {
		case r.GetKind() == "ConfigMap" && r.GetName() == "gdr-config":
			data := r.GetDataMap()
			for k, want := range map[string]string{
				"GDR_NATS_URL": env["NATS"], "GDR_NATS_REPLICAS": env["NATS_REPLICAS"], "GDR_GITEA_URL": env["GITEA"],
				"GDR_TRUST_DOMAIN": env["TD"], "GDR_CLUSTER_NAME": env["CLUSTER"], "GDR_SPIRE_SERVER": env["SPIRE"],
				"GDR_GATEWAY_SPIFFE_ID": "spiffe://" + env["TD"] + "/gateway",
			} {
				if data[k] != want {
					t.Errorf("gdr-config %s = %q, want %q", k, data[k], want)
				}
			}
		case r.GetKind() == "ConfigMap" && r.GetName() == "gdr-pools":
			pools := r.GetDataMap()["pools.yaml"]
			if pools != string(file) {
				t.Errorf("gdr-pools' pools.yaml is not my-deploy/pools.yaml, which register reads:\n%s\n---\n%s", pools, file)
			}
			for _, img := range []string{"runner", "runner-host"} {
				if want := env["REG"] + "/gitea-dynamic-runner-" + img + ":" + env["TAG"]; !strings.Contains(pools, want+"\n") {
					t.Errorf("the pools file does not name %s", want)
				}
			}
		case r.GetKind() == "ScaledJob" || r.GetKind() == "ScaledObject":
			y, _ := r.AsYAML()
			if !bytes.Contains(y, []byte("natsServerMonitoringEndpoint: "+env["NATS_MONITOR"])) {
				t.Errorf("%s %s's trigger does not read %s", r.GetKind(), r.GetName(), env["NATS_MONITOR"])
			}
			if r.GetName() == "dispatch" && !bytes.Contains(y, []byte("url: "+env["GITEA"]+"api/v1/admin/actions/jobs?status=queued&limit=50")) {
				t.Errorf("ScaledObject dispatch does not read %s's queue:\n%s", env["GITEA"], y)
			}
		}
	}
	for _, f := range []string{"dispatch", "handle", "recover", "gateway"} {
		if want := env["REG"] + "/gitea-dynamic-runner-" + f + ":" + env["TAG"]; !bytes.Contains(built, []byte("image: "+want+"\n")) {
			t.Errorf("no container runs %s", want)
		}
	}
}

// cutPools runs the pipeline of section's command that starts with source (up to its " > ") on
// input, and checks that it cuts out the pools file want; it returns what it cut.
func cutPools(t *testing.T, section, source string, input []byte, want string) []byte {
	t.Helper()
	pipeline := strings.TrimPrefix(sectionCommands(t, section, source)[0], source)
	pipeline = pipeline[:strings.Index(pipeline, " > ")]
	c := exec.Command("bash", "-c", pipeline)
	c.Stdin = bytes.NewReader(input)
	got, err := c.Output()
	if err != nil {
		t.Fatalf("%s: %v", pipeline, err)
	}
	if string(got) != want {
		t.Fatalf("the registration step cuts out\n%s\nwant the gdr-pools pools.yaml\n%s", got, want)
	}
	return got
}

// sectionCommands returns the shell commands of README.md's section (its
// heading) that start with prefix, continuation lines joined.
func sectionCommands(t *testing.T, section, prefix string) []string {
	t.Helper()
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, section)
	if start < 0 {
		t.Fatalf("README.md has no %q", section)
	}
	text = text[start+len(section):]
	if end := strings.Index(text, "\n## "); end >= 0 {
		text = text[:end]
	}
	var out []string
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(lines[i])
		}
		out = append(out, line)
	}
	if len(out) == 0 {
		t.Fatalf("README.md's %q has no command starting %q", section, prefix)
	}
	return out
}

// giteaWebhookQueueINI is the app.ini section deploy/README.md's
// prerequisites give Gitea, which the cluster tests' Gitea runs with.
const giteaWebhookQueueINI = "[queue.webhook_sender]\nTYPE = channel\n"

// TestReadmeGiteaQueue: the README's Gitea advice is the section the cluster
// tests run Gitea with.
func TestReadmeGiteaQueue(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "```ini\n" + giteaWebhookQueueINI + "```"
	var found bool
	// The block is indented under its list item.
	for _, indent := range []string{"", "  "} {
		block := indent + strings.ReplaceAll(strings.TrimSuffix(want, "\n"), "\n", "\n"+indent)
		found = found || strings.Contains(string(raw), block)
	}
	if !found {
		t.Fatalf("deploy/README.md does not give Gitea\n%s", want)
	}
}

// The rule of TestReadmeBlocks on example values, on lines a block could hold.
func TestExampleValues(t *testing.T) {
	for _, tc := range []struct {
		line string
		bad  bool
	}{
		{`helm install gdr oci://registry.example.com/ci/gitea-dynamic-runner`, true},
		{`GDR_GITEA_URL=https://gitea.example.org/`, true},
		{`image: ghcr.io/example/other:v1`, true},
		{`runnerImage: PLACEHOLDER`, true},
		{`sed "s#ghcr.io/example/\(gitea-dynamic-runner-runner[a-z-]*\):latest#$REG/\1:$TAG#"`, false},
		{`echo "  - {name: ghcr.io/example/gitea-dynamic-runner-$f, newName: $REG/gitea-dynamic-runner-$f}"`, false},
		{`kubectl kustomize my-deploy | grep -n 'PLACEHOLDER' || true`, false},
		{`helm install gdr "oci://$REG/gitea-dynamic-runner"`, false},
	} {
		if got := exampleValue.MatchString(shippedPlaceholders.ReplaceAllString(tc.line, "")); got != tc.bad {
			t.Errorf("%q: flagged %v, want %v", tc.line, got, tc.bad)
		}
	}
}

// shellNames walks a parsed block: the variables it sets (assignments, for loops), those it
// expands, and the commands it calls (each call's first word, where it is a literal; "" where
// it is not).
func shellNames(f *syntax.File) (own, uses map[string]bool, calls []string) {
	own, uses = map[string]bool{}, map[string]bool{}
	syntax.Walk(f, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.CallExpr:
			if len(n.Args) > 0 {
				calls = append(calls, n.Args[0].Lit())
			}
		case *syntax.Assign:
			own[n.Name.Value] = true
		case *syntax.WordIter:
			own[n.Name.Value] = true
		case *syntax.ParamExp:
			uses[n.Param.Value] = true
		}
		return true
	})
	return own, uses, calls
}
