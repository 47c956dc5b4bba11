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
	return flock(f, syscall.LOCK_EX)
}

// lockExisting takes an flock(2) of path, exclusive or shared, which must
// exist (fs.ErrNotExist otherwise).
func lockExisting(path string, exclusive bool) (func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if exclusive {
		return flock(f, syscall.LOCK_EX)
	}
	return flock(f, syscall.LOCK_SH)
}

// flock locks f as how says; the function it returns releases the lock by
// closing f (f is closed too if the lock fails).
func flock(f *os.File, how int) (func(), error) {
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { _ = f.Close() }, nil // closing releases the lock
}
