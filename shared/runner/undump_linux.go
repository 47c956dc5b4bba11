package runner

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// undump makes this process non-dumpable: a process of the same user (a
// job's step) may then neither ptrace it nor open its /proc/<pid>/mem,
// maps, environ or fd, and its /proc/<pid> files belong to root. The
// process itself keeps its own /proc/self/exe and fd; an execve of this
// process would make it dumpable again, a child's never affects it.
func undump() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl PR_SET_DUMPABLE: %w", err)
	}
	return nil
}
