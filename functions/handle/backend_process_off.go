//go:build !gdr_process && (gdr_process || gdr_pod || gdr_opensandbox)

package main

import "github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"

// processBackend is nil: the build tags select other backends only (see
// linkedBackends).
func processBackend() backend.Builder { return nil }
