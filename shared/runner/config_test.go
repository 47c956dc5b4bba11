package runner

import (
	"flag"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
)

var update = flag.Bool("update", false, "rewrite runner's table in docs/CONFIGURATION.md (make docs)")

// TestConfigurationDoc keeps runner's table in docs/CONFIGURATION.md what
// envdoc renders from Config; with -update it rewrites that table.
func TestConfigurationDoc(t *testing.T) {
	if err := envdoc.Sync("../../docs/CONFIGURATION.md", "runner", function.EnvPrefix, &Config{}, *update); err != nil {
		t.Fatal(err)
	}
}
