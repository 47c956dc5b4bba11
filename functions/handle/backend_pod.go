//go:build gdr_pod || !(gdr_process || gdr_pod || gdr_opensandbox)

package main

import (
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backends"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/podbackend"
)

// podBackend is the builder of the pod backend (client-go, gRPC), linked
// unless the build tags select other backends only (see linkedBackends).
func podBackend() backends.Builder { return podbackend.Build }
