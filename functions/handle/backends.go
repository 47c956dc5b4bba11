package main

import (
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// linkedBackends are the backends this build of handle links. A build links
// every backend unless its build tags name some (gdr_process, gdr_pod,
// gdr_opensandbox): then it links those only, and neither the code nor the
// package initialisation of the others. `go build -tags gdr_process
// ./functions/handle` is a handle for the process backend without client-go
// or gRPC, which starts in about 60 % of the time and 45 % of the memory of
// one with every backend (docs/BENCHMARKS.md, "Cold start"). GDR_BACKEND
// naming a backend the build does not link is a configuration error
// (Config.Check).
func linkedBackends() backend.Builders {
	return backend.Builders{
		taskassignment.BackendProcess:     processBackend(),
		taskassignment.BackendOpenSandbox: opensandboxBackend(),
		taskassignment.BackendPod:         podBackend(),
	}
}
