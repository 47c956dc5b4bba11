// Command runner runs inside an executor and executes its one Gitea task
// (see package runner).
package main

import (
	"os"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runner"
)

func main() {
	os.Exit(runner.Main(os.Args[:1], os.Args[1:]))
}
