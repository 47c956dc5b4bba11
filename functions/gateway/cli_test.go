package main

import (
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
)

// The command line follows every function's conventions
// (functiontest.Conventions), run in process; without configuration it
// exits 2 and says so.
func TestCommandLine(t *testing.T) {
	functiontest.Run(t, "gateway", execute, append(functiontest.Conventions("gateway", true),
		functiontest.Case{Name: "no configuration", Code: 2, Want: []string{"gateway: configuration: required variables not set"}}))
}
