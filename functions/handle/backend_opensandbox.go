//go:build gdr_opensandbox || !(gdr_process || gdr_pod || gdr_opensandbox)

package main

import (
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backends"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/opensandboxbackend"
)

// opensandboxBackend is the builder of the opensandbox backend, linked unless the build
// tags select other backends only (see linkedBackends).
func opensandboxBackend() backends.Builder { return opensandboxbackend.Build }
