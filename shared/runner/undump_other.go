//go:build !linux

package runner

// undump does nothing where there is no PR_SET_DUMPABLE; executors run on
// Linux, and local mode elsewhere leaves a runner's memory open to the
// processes of its user (docs/SECURITY.md, "Known gaps").
func undump() error { return nil }
