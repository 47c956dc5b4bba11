package envdoc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"
)

type Inner struct {
	URL string `envconfig:"GDR_NATS_URL" default:"nats://x:4222" desc:"where NATS is"`
}

type spec struct {
	Inner
	Mode  string        `envconfig:"GDR_MODE" default:"job" desc:"job or http"`
	Key   string        `envconfig:"GDR_KEY" required:"true" desc:"a key"`
	Wait  time.Duration `envconfig:"GDR_WAIT" default:"2s" desc:"how long"`
	Plain string        `envconfig:"GDR_PLAIN" desc:"no default"`
}

func TestVars(t *testing.T) {
	vars, err := Vars(&spec{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Var{
		{Name: "GDR_NATS_URL", Default: "nats://x:4222", Desc: "where NATS is"},
		{Name: "GDR_MODE", Default: "job", Desc: "job or http"},
		{Name: "GDR_KEY", Required: true, Desc: "a key"},
		{Name: "GDR_WAIT", Default: "2s", Desc: "how long"},
		{Name: "GDR_PLAIN", Desc: "no default"},
	}
	if len(vars) != len(want) {
		t.Fatalf("Vars() = %+v", vars)
	}
	for i := range want {
		if vars[i] != want[i] {
			t.Errorf("var %d = %+v, want %+v", i, vars[i], want[i])
		}
	}
}

func TestTable(t *testing.T) {
	vars, err := Vars(&spec{})
	if err != nil {
		t.Fatal(err)
	}
	want := "| Variable | Default | What it does |\n|---|---|---|\n" +
		"| `GDR_NATS_URL` | `nats://x:4222` | where NATS is |\n" +
		"| `GDR_MODE` | `job` | job or http |\n" +
		"| `GDR_KEY` | required | a key |\n" +
		"| `GDR_WAIT` | `2s` | how long |\n" +
		"| `GDR_PLAIN` |  | no default |\n"
	if got := table(vars); got != want {
		t.Fatalf("table() =\n%s\nwant\n%s", got, want)
	}
	var usage strings.Builder
	if err := Usage(&usage, &spec{}); err != nil || !strings.Contains(usage.String(), "GDR_KEY") || !strings.Contains(usage.String(), "(required)") {
		t.Fatalf("Usage() = %q, %v", usage.String(), err)
	}
}

func TestSection(t *testing.T) {
	doc := []byte("# x\n<!-- envdoc:begin a -->\nold\n<!-- envdoc:end a -->\n<!-- envdoc:begin b -->\n<!-- envdoc:end b -->\ntail\n")
	if got, err := section(doc, "a"); err != nil || got != "old\n" {
		t.Fatalf("section(a) = %q, %v", got, err)
	}
	if got, err := section(doc, "b"); err != nil || got != "" {
		t.Fatalf("section(b) = %q, %v", got, err)
	}
	out, err := replaceSection(doc, "b", "new\n")
	if err != nil || string(out) != strings.Replace(string(doc), "b -->\n<!--", "b -->\nnew\n<!--", 1) {
		t.Fatalf("replaceSection(b) = %q, %v", out, err)
	}
	for name, bad := range map[string]string{
		"missing":        "# x\n",
		"no end":         "<!-- envdoc:begin a -->\nx\n",
		"twice":          "<!-- envdoc:begin a -->\n<!-- envdoc:end a -->\n<!-- envdoc:begin a -->\n<!-- envdoc:end a -->\n",
		"reversed":       "<!-- envdoc:end a -->\n<!-- envdoc:begin a -->\n",
		"not on its own": "see <!-- envdoc:begin a -->\n<!-- envdoc:end a -->\n",
	} {
		if _, err := section([]byte(bad), "a"); err == nil {
			t.Errorf("%s: Section found a section in %q", name, bad)
		}
	}
}

// Sync fails on a stale section, naming the row, and with update rewrites
// that section alone; then it passes.
func TestSync(t *testing.T) {
	vars, err := Vars(&spec{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "CONFIGURATION.md")
	head, tail := "# Configuration\n\nprose\n\n<!-- envdoc:begin f -->\n", "<!-- envdoc:end f -->\n\n## other\n"
	want := "\n" + table(vars) + "\n"
	stale := strings.Replace(want, "`2s`", "`5s`", 1)
	if err := os.WriteFile(path, []byte(head+stale+tail), 0o644); err != nil {
		t.Fatal(err)
	}
	err = Sync(path, "f", &spec{}, false)
	if err == nil || !strings.Contains(err.Error(), "+ | `GDR_WAIT` | `2s` |") || !strings.Contains(err.Error(), "- | `GDR_WAIT` | `5s` |") {
		t.Fatalf("Sync() of a stale section = %v", err)
	}
	if err := Sync(path, "f", &spec{}, true); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != head+want+tail {
		t.Fatalf("after the update the file reads\n%s", got)
	}
	if err := Sync(path, "f", &spec{}, false); err != nil {
		t.Fatalf("Sync() after the update = %v", err)
	}
	if err := Sync(path, "g", &spec{}, true); err == nil {
		t.Fatal("Sync() wrote a section the file does not mark")
	}
}

func TestProcessNamesMissingVariables(t *testing.T) {
	t.Setenv("GDR_MODE", "http")
	var s spec
	err := Process(&s)
	if err == nil || !strings.Contains(err.Error(), "GDR_KEY") {
		t.Fatalf("Process() error = %v, want it to name GDR_KEY", err)
	}
	t.Setenv("GDR_KEY", "k")
	if err := Process(&s); err != nil {
		t.Fatal(err)
	}
	if s.Mode != "http" || s.Key != "k" || s.Wait != 2*time.Second || s.URL != "nats://x:4222" {
		t.Fatalf("spec = %+v", s)
	}
}

// Missing required variables are reported, all of them, before a value that
// does not parse (which envconfig alone would report first, or alone).
func TestProcessReportsMissingBeforeMalformed(t *testing.T) {
	type twoRequired struct {
		Count int    `envconfig:"GDR_COUNT" default:"1"`
		A     string `envconfig:"GDR_A" required:"true"`
		B     string `envconfig:"GDR_B" required:"true"`
	}
	t.Setenv("GDR_COUNT", "not a number")
	if err := Process(&twoRequired{}); err == nil || err.Error() != "required variables not set: GDR_A, GDR_B" {
		t.Fatalf("Process() error = %v, want both missing variables named", err)
	}
}

// A malformed value is named by its variable, never quoted: the value may be
// a key or a token.
func TestProcessNeverEchoesAValue(t *testing.T) {
	type withNumbers struct {
		Count int           `envconfig:"GDR_COUNT" default:"1"`
		Wait  time.Duration `envconfig:"GDR_WAIT" default:"2s"`
		On    bool          `envconfig:"GDR_ON" default:"false"`
	}
	const secret = "hunter2-secret-value"
	for _, tc := range []struct{ name, variable, value, want string }{
		{"int", "GDR_COUNT", secret, "GDR_COUNT: not a valid int: invalid syntax"},
		{"int out of range", "GDR_COUNT", "99999999999999999999999", "GDR_COUNT: not a valid int: value out of range"},
		{"duration", "GDR_WAIT", secret, "GDR_WAIT: not a valid time.Duration"},
		{"bool", "GDR_ON", secret, "GDR_ON: not a valid bool: invalid syntax"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.variable, tc.value)
			err := Process(&withNumbers{})
			if err == nil || err.Error() != tc.want || strings.Contains(err.Error(), tc.value) {
				t.Fatalf("Process() error = %v, want %q (and never the value)", err, tc.want)
			}
		})
	}
}

// envconfig under a prefix falls back to a tagged field's bare name (the
// fault), and Process, which reads each field's full name with no prefix,
// never does (the outcome).
func TestProcessIgnoresBareNames(t *testing.T) {
	type prefixed struct {
		Mode string `envconfig:"MODE" default:"job"`
	}
	t.Setenv("MODE", "x")
	t.Setenv("GDR_KEY", "k")
	var old prefixed
	if err := envconfig.Process("GDR", &old); err != nil || old.Mode != "x" {
		t.Fatalf("envconfig.Process(\"GDR\") read Mode %q (err %v): the bare-name fallback this guards against is gone", old.Mode, err)
	}
	var s spec
	if err := Process(&s); err != nil {
		t.Fatal(err)
	}
	if s.Mode != "job" {
		t.Fatalf("Mode = %q with MODE=x set, want the default job", s.Mode)
	}
}

// A field without a tag would be read from its bare field name: Vars
// refuses it, naming the field.
func TestVarsRefusesUntaggedField(t *testing.T) {
	type untagged struct {
		Capacity int `default:"1"`
	}
	if _, err := Vars(&untagged{}); err == nil || !strings.Contains(err.Error(), "field Capacity has no envconfig tag") {
		t.Fatalf("Vars() error = %v, want the untagged field named", err)
	}
}
