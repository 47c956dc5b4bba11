package opensandboxenv

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// watchdog undoes what the server leaves on the machine once the test binary
// is gone without Stop (a timeout panic, a kill). The processes need no
// watchdog: the parent-death signal kills unshare, whose --kill-child kills
// the namespace's init, which ends the whole PID namespace (containers
// included) and with it the mount and network namespaces. What is left is
// the cgroup folders dockerd made and the server's folder.
//
// It is a shell in its own process group, blocked reading a pipe whose only
// writer is the test process. Stop writes a line: the shell exits and does
// nothing. If the test process dies instead, the read ends without a line
// and the shell removes the cgroup folders (retrying while the last
// processes leave) and the folder.
type watchdog struct {
	w   *os.File
	cmd *exec.Cmd
}

const watchdogScript = `
if read -r _; then exit 0; fi
dir=$1; shift
sleep 1
for try in 1 2 3 4 5 6 7 8 9 10; do
  left=
  for cg in "$@"; do
    [ -d "$cg" ] || continue
    find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null
    [ -d "$cg" ] && left=1
  done
  [ -z "$left" ] && break
  sleep 1
done
case "$dir" in */gdr-osd-*) rm -rf -- "$dir" ;; esac
`

// startWatchdog watches for the test process to go without Stop; dir is
// the server's folder, cgDirs the cgroup folders.
func startWatchdog(dir string, cgDirs []string) (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("watchdog pipe: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", append([]string{"-c", watchdogScript, "opensandboxenv-watchdog", dir}, cgDirs...)...)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start watchdog: %w", err)
	}
	return &watchdog{w: w, cmd: cmd}, nil
}

// release tells the watchdog that Stop ran, and waits for it to exit.
func (d *watchdog) release() {
	_, _ = d.w.Write([]byte("stopped\n"))
	d.w.Close()
	_ = d.cmd.Wait()
}
