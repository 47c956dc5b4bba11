// Package dirlock makes a directory one process's alone: an advisory lock
// (flock) on a file in it, held for the life of the process that took it.
//
// Invariants: the lock is the kernel's, on an open file description that no
// child process inherits (the file is opened close-on-exec), so it is free
// the moment its holder is gone, however it ended (SIGKILL included), even
// while children it started live on; a file left behind by a dead holder
// never blocks. The file records the holder (PID, host, start time) so that
// a process refused can say who holds the directory.
package dirlock

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// FileName is the lock file's name in the directory.
const FileName = "lock"

// Holder is what the lock file says of the process that holds it.
type Holder struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Started time.Time `json:"started"`
}

func (h Holder) String() string {
	return fmt.Sprintf("process %d on %s, since %s", h.PID, h.Host, h.Started.Format(time.RFC3339))
}

// HeldError says the directory is locked by another process.
type HeldError struct {
	Dir string
	// Holder is who holds it, as its lock file says; zero when the holder
	// has not written it yet (it took the lock a moment ago).
	Holder Holder
}

func (e *HeldError) Error() string {
	if e.Holder.PID == 0 {
		return fmt.Sprintf("%s is in use by another process (it has not said which yet)", e.Dir)
	}
	return fmt.Sprintf("%s is in use by %s", e.Dir, e.Holder)
}

// Lock is a held directory lock.
type Lock struct {
	f *os.File
}

// Acquire creates dir (mode 0700) when missing and locks it for this
// process, without waiting: a *HeldError when another process holds it.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	// os.OpenFile opens close-on-exec: no child holds the lock.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := flock(f); err != nil {
		f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		held := &HeldError{Dir: dir}
		if data, err := os.ReadFile(path); err == nil {
			_ = json.Unmarshal(data, &held.Holder)
		}
		return nil, held
	}
	host, _ := os.Hostname()
	data, err := json.Marshal(Holder{PID: os.Getpid(), Host: host, Started: time.Now().UTC().Truncate(time.Second)})
	if err == nil {
		err = f.Truncate(0)
	}
	if err == nil {
		_, err = f.WriteAt(data, 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: record the holder: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// flock takes f's exclusive lock without waiting, asking again when a
// signal interrupted the call.
func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Release frees the lock; the file stays (a later Acquire rewrites it).
// The lock is also freed when the process ends.
func (l *Lock) Release() error {
	return l.f.Close()
}
