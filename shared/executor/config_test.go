package executor

import (
	"os"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
)

func TestREADMEDocumentsEveryVariable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	vars, err := envdoc.Vars(EnvPrefix, &Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := envdoc.CheckDocumented(readme, vars); err != nil {
		t.Fatal(err)
	}
}
