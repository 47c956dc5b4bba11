//go:build gdr_process || !(gdr_process || gdr_pod || gdr_opensandbox)

package main

import (
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/process"
)

// processBackend is the builder of the process backend, linked unless the build
// tags select other backends only (see linkedBackends).
func processBackend() backend.Builder { return process.Build }
