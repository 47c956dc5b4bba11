//go:build !gdr_pod && (gdr_opensandbox || gdr_pod || gdr_process)

package main

import (
	"context"
	"fmt"
	"io"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
)

// keys: `handle keys` keeps the keys in Kubernetes, which this build (without the pod
// backend) does not link.
func keys(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "handle: keys: this handle is built without the pod backend (gdr_pod), which `keys` needs to reach Kubernetes")
	return function.ExitConfig
}
