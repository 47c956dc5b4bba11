// Package process builds the process backend (shared/processbackend) from
// handle's and recover's settings: executors as local processes, their
// SVIDs minted by a local CA.
package process

import (
	"fmt"
	"os"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backends"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/processbackend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// New is the process backend's backends.Builder: its CA is loaded from
// c.CADir (created if absent), and its executors inherit the environment
// processbackend.InheritedEnv keeps of this process's. It holds nothing open.
func New(c backends.Setup, d backends.Deps) (backends.Backend, func() error, error) {
	if err := c.Check(taskassignment.BackendProcess); err != nil {
		return nil, nil, err
	}
	ca, err := svidca.LoadOrCreate(c.CADir, d.TrustDomain)
	if err != nil {
		return nil, nil, fmt.Errorf("GDR_CA_DIR: %w", err)
	}
	b, err := processbackend.New(processbackend.Config{Dir: c.ProcessDir, Runner: c.RunnerBin, Keys: d.Keys,
		TrustDomain: d.TrustDomain, Minter: ca, Env: processbackend.InheritedEnv(os.Environ()), OnCorrupt: d.Corrupt()})
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return nil }, nil
}
