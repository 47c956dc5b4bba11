//go:build !unix

package actionscache

// lockFile is a no-op where flock(2) is missing: one process per directory.
func lockFile(string) (func(), error) { return func() {}, nil }
