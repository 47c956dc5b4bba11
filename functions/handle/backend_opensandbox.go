//go:build gdr_opensandbox || !(gdr_process || gdr_pod || gdr_opensandbox)

package main

import (
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
)

// opensandboxBackend is the builder of the opensandbox backend, linked unless the build
// tags select other backends only (see linkedBackends).
func opensandboxBackend() backend.Builder { return opensandbox.Build }
