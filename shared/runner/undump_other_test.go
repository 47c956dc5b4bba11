//go:build !linux

package runner

// undumpChild has no part to play where the runner has nothing to undump.
func undumpChild(string) int { return 3 }
