//go:build !linux

package runner

import (
	"fmt"
	"os"
	"syscall"
)

// pipeCapacity is what a pipe holds on every platform without a reader.
const pipeCapacity = 16 << 10

// handoverFD returns a descriptor, kept open across exec, from which the
// re-executed runner reads data: a pipe, written in full before the exec. A
// write larger than a pipe holds would block forever with no reader, so it
// is refused instead (Linux, where executors run, uses a memfd and has no
// such limit).
func handoverFD(data []byte) (int, error) {
	if len(data) > pipeCapacity {
		return -1, fmt.Errorf("%d bytes of bootstrap values, more than a pipe holds on this platform (%d)", len(data), pipeCapacity)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return -1, fmt.Errorf("pipe: %w", err)
	}
	if _, err := w.Write(data); err != nil {
		return -1, fmt.Errorf("pipe: %w", err)
	}
	_ = w.Close()
	fd, err := syscall.Dup(int(r.Fd())) // a descriptor without close-on-exec
	if err != nil {
		return -1, fmt.Errorf("pipe: %w", err)
	}
	return fd, nil
}
