// Command runner runs inside an executor and executes its one Gitea task
// (see package executor).
package main

import (
	"os"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
)

func main() {
	os.Exit(executor.Main(os.Args[:1], os.Args[1:]))
}
