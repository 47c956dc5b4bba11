package main

import (
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
)

// The command line follows every function's conventions
// (functiontest.Conventions), run in process; dispatch needs a command, and
// each command its configuration.
func TestCommandLine(t *testing.T) {
	const unset = "dispatch: configuration: required variables not set"
	functiontest.Run(t, "dispatch", execute, append(functiontest.Conventions("dispatch", false),
		functiontest.Case{Name: "no configuration", Args: []string{"run"}, Code: 2, Want: []string{unset}},
		functiontest.Case{Name: "no command", Code: 2, Want: []string{"dispatch: no command", "usage: dispatch"}, NotWant: []string{"configuration"}},
		functiontest.Case{Name: "status needs the configuration", Args: []string{"status"}, Code: 2, Want: []string{unset}},
	))
}
