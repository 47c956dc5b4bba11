package process

import (
	"fmt"
	"os"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Registration is the process backend's (GDR_BACKEND=process), as package
// backend/linked links it.
func Registration() backend.Registration {
	return backend.Registration{Kind: taskassignment.BackendProcess, Check: backend.CheckProcess, Build: Build}
}

// Build is the process backend's backend.Builder: its CA is loaded from
// c.CADir (created if absent), and its executors inherit the environment
// InheritedEnv keeps of this process's. It holds nothing open.
func Build(c backend.BuildSettings, d backend.Deps) (executor.Backend, func() error, error) {
	if err := backend.CheckProcess(c); err != nil {
		return nil, nil, err
	}
	ca, err := svidca.LoadOrCreate(c.CADir, d.TrustDomain)
	if err != nil {
		return nil, nil, fmt.Errorf("GDR_CA_DIR: %w", err)
	}
	b, err := New(Config{Dir: c.ProcessDir, Runner: c.RunnerBin, Pools: d.Pools, Keys: d.Keys,
		TrustDomain: d.TrustDomain, Minter: ca, Env: InheritedEnv(os.Environ()), OnCorrupt: d.Corrupt()})
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return nil }, nil
}
