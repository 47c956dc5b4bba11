package main

import (
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function/functiontest"
)

// The command line follows every function's conventions
// (functiontest.Conventions), run in process; without configuration it
// exits 2 and says so.
func TestCommandLine(t *testing.T) {
	functiontest.Run(t, "recover", execute, append(functiontest.Conventions("recover", true),
		functiontest.Case{Name: "no configuration", Code: 2, Want: []string{"recover: configuration: required variables not set"}},
		functiontest.Case{Name: "status help", Args: []string{"status", "-h"}, Code: 0, Want: []string{"output format: table or json"}},
		functiontest.Case{Name: "status in an unknown format", Args: []string{"status", "-o", "yaml"}, Code: 2, Want: []string{`invalid value "yaml" for flag -o: want table or json`, "Usage of recover status"}},
		functiontest.Case{Name: "status without configuration", Args: []string{"status"}, Code: 2, Want: []string{"recover: configuration: required variables not set"}}))
}
