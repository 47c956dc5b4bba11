//go:build gdr_process || !(gdr_process || gdr_pod || gdr_opensandbox)

package main

import (
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backends"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/processbackend"
)

// processBackend is the builder of the process backend, linked unless the build
// tags select other backends only (see linkedBackends).
func processBackend() backends.Builder { return processbackend.Build }
