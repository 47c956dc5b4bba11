package runner

import (
	"flag"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
)

var update = flag.Bool("update", false, "rewrite runner's table in docs/CONFIGURATION.md (make docs)")

// TestConfigurationDoc keeps runner's table in docs/CONFIGURATION.md what
// envdoc renders from Config; with -update it rewrites that table.
func TestConfigurationDoc(t *testing.T) {
	if err := envdoc.Sync("../../docs/CONFIGURATION.md", "runner", &Config{}, *update); err != nil {
		t.Fatal(err)
	}
}

// TestBareNamesIgnored: runner reads each setting from its GDR_ name only; a
// bare MODE, BACKEND or CAPACITY in its environment changes nothing.
func TestBareNamesIgnored(t *testing.T) {
	functiontest.BareNamesIgnored(t, func() any { return &Config{} })
}
