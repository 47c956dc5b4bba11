package executor

import (
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
)

func TestREADMEDocumentsEveryVariable(t *testing.T) {
	if err := envdoc.CheckFile("../../README.md", EnvPrefix, &Config{}); err != nil {
		t.Fatal(err)
	}
}
