package runner

import (
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
)

func TestREADMEDocumentsEveryVariable(t *testing.T) {
	if err := envdoc.CheckFile("../../README.md", function.EnvPrefix, &Config{}); err != nil {
		t.Fatal(err)
	}
}
