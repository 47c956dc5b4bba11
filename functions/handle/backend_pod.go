//go:build gdr_pod || !(gdr_process || gdr_pod || gdr_opensandbox)

package main

import (
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
)

// podBackend is the builder of the pod backend (client-go, gRPC), linked
// unless the build tags select other backends only (see linkedBackends).
func podBackend() backend.Builder { return pod.Build }
