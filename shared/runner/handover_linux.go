package runner

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// handoverFD returns a descriptor, kept open across exec, from which the
// re-executed runner reads data. It is an anonymous memory file (memfd), not
// a pipe: nothing has to read it while it is written, so the hand-over
// cannot block however large the values are (a trust bundle of many
// authorities), and nothing of it touches a disk.
func handoverFD(data []byte) (int, error) {
	fd, err := unix.MemfdCreate("gdr-bootstrap", 0) // no MFD_CLOEXEC: it must survive the exec
	if err != nil {
		return -1, fmt.Errorf("memfd: %w", err)
	}
	for off := 0; off < len(data); {
		n, err := unix.Write(fd, data[off:])
		if err != nil {
			_ = unix.Close(fd)
			return -1, fmt.Errorf("memfd: %w", err)
		}
		off += n
	}
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("memfd: %w", err)
	}
	return fd, nil
}
