package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// installSection is the heading of README.md's install steps.
const installSection = "## Install from an empty cluster (KEDA)"

// installCommands returns the shell commands of the install steps' code
// blocks that start with prefix, continuation lines joined.
func installCommands(t *testing.T, prefix string) []string {
	t.Helper()
	return sectionCommands(t, installSection, prefix)
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
		t.Fatalf("step 7 cuts out\n%s\nwant the gdr-pools pools.yaml\n%s", got, want)
	}
	return got
}

// TestInstallStepsSetEveryValue runs the install steps' edits of a copy of
// the manifests (step 6's sed commands, with the kustomize edits done the way
// `kustomize edit` does them) and builds keda: every value the steps set
// must land where the functions read it, and no placeholder registry, NATS,
// Gitea, trust domain or cluster name may be left. Then step 7's pipeline
// that cuts the pools file out of `kubectl kustomize keda` must return the
// gdr-pools ConfigMap's pools.yaml exactly (what `dispatch register` reads).
func TestInstallStepsSetEveryValue(t *testing.T) {
	if _, err := exec.LookPath("sed"); err != nil {
		t.Skip("no sed on this machine")
	}
	root := copyDeploy(t)
	env := map[string]string{
		"NS": "ci-runners", "REG": "registry.test/ci", "TAG": "v9",
		"TD": "ci.test", "CLUSTER": "c-7", "GITEA": "https://git.test/",
		"NATS": "nats://n.test:4222", "NATS_MONITOR": "n.test:8222", "NATS_REPLICAS": "5",
	}
	environ := os.Environ()
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	for _, cmd := range installCommands(t, "sed -i") {
		c := exec.Command("bash", "-c", cmd)
		c.Dir, c.Env = root, environ
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
	}
	override(t, filepath.Join(root, "keda"), env["NS"], env["REG"], env["TAG"])

	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(root, "keda"))
	if err != nil {
		t.Fatal(err)
	}
	built, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	for _, left := range []string{"ghcr.io/example/", "nats.nats.svc", "gitea.example.com", "example.org", "example-cluster"} {
		if bytes.Contains(built, []byte(left)) {
			t.Errorf("the build still names %q after the install steps", left)
		}
	}
	var pools string
	for _, r := range m.Resources() {
		if r.GetKind() == "ConfigMap" && r.GetName() == "gdr-config" {
			data := r.GetDataMap()
			for k, want := range map[string]string{
				"GDR_NATS_URL": env["NATS"], "GDR_NATS_REPLICAS": env["NATS_REPLICAS"], "GDR_GITEA_URL": env["GITEA"], "GDR_TRUST_DOMAIN": env["TD"],
				"GDR_CLUSTER_NAME": env["CLUSTER"], "GDR_GATEWAY_SPIFFE_ID": "spiffe://" + env["TD"] + "/gateway",
			} {
				if data[k] != want {
					t.Errorf("gdr-config %s = %q, want %q", k, data[k], want)
				}
			}
		}
		if r.GetKind() == "ConfigMap" && r.GetName() == "gdr-pools" {
			pools = r.GetDataMap()["pools.yaml"]
		}
	}
	for _, img := range []string{"runner", "runner-host"} {
		if want := env["REG"] + "/gitea-dynamic-runner-" + img + ":" + env["TAG"]; !strings.Contains(pools, want+"\n") {
			t.Errorf("the pools file does not name %s", want)
		}
	}

	// Step 7: the pools file out of the build.
	got := cutPools(t, installSection, "kubectl kustomize keda |", built, pools)
	var parsed map[string]any
	if err := yaml.UnmarshalStrict(got, &parsed); err != nil || len(parsed) == 0 {
		t.Fatalf("step 7's pools file does not parse: %v", err)
	}
}
