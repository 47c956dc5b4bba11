//go:build !unix

package actionscache

import "os"

// lockFile is a no-op where flock(2) is missing: one process per directory.
func lockFile(string) (func(), error) { return func() {}, nil }

// lockExisting checks that path exists; where flock(2) is missing a commit
// does not wait for its chunks (the cache is served from unix only).
func lockExisting(path string, _ bool) (func(), error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	return func() {}, nil
}
