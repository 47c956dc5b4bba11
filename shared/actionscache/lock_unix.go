//go:build unix

package actionscache

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive flock(2) of path, which it creates.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { _ = f.Close() }, nil // closing releases the lock
}

// lockExisting takes an flock(2) of path, exclusive or shared, which must
// exist (fs.ErrNotExist otherwise).
func lockExisting(path string, exclusive bool) (func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { _ = f.Close() }, nil // closing releases the lock
}
