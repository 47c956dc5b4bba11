//go:build !gdr_pod && (gdr_process || gdr_pod || gdr_opensandbox)

package main

import "github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"

// podBackend is nil: the build tags select other backends only (see
// linkedBackends).
func podBackend() backend.Builder { return nil }
