package backend

import "errors"

// ProcessSettings are the process backend's own settings (BuildSettings).
type ProcessSettings struct {
	ProcessDir string `envconfig:"GDR_PROCESS_DIR" default:"/var/lib/gitea-dynamic-runner/executors" desc:"process backend: one directory per executor"`
	RunnerBin  string `envconfig:"GDR_RUNNER_BIN" default:"runner" desc:"process backend: the runner binary (looked up in PATH)"`
}

// CheckProcess is the process backend's Registration.Check.
func CheckProcess(c BuildSettings) error {
	if c.CADir == "" {
		return errors.New("GDR_CA_DIR: the process backend needs a CA to mint executor SVIDs")
	}
	return nil
}
