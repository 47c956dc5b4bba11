package kubeenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// watchdog kills the control plane's processes once the test binary is gone,
// however it went. It is a shell in its own process group blocked reading a
// pipe whose only writer is this process: when this process exits, the read
// ends and the shell kills each process it was given, by PID, after checking
// that /proc/<pid>/exe is still the expected full path (so a reused PID is
// never hit), and then removes the data folder. After a normal Stop the
// processes are gone and it does nothing.
type watchdog struct {
	w   *os.File
	cmd *exec.Cmd
}

const watchdogScript = `
read -r _ || true
hit=
for spec in "$@"; do
  pid=${spec%%:*}; path=${spec#*:}
  if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$path" ]; then kill -TERM "$pid" 2>/dev/null; hit=1; fi
done
[ -n "$hit" ] || exit 0
sleep 5
for spec in "$@"; do
  pid=${spec%%:*}; path=${spec#*:}
  if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$path" ]; then kill -KILL "$pid" 2>/dev/null; fi
done
sleep 1
case "$0" in */gdr-kubeenv-*) rm -rf -- "$0" ;; esac
`

// startWatchdog watches children ("pid:path", from childrenRunning) and the
// folder data. Without children (no /proc: not Linux) it watches nothing.
func startWatchdog(data string, children []string) (*watchdog, error) {
	if len(children) == 0 {
		return nil, nil // no /proc: no watchdog; Stop still works
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("kubeenv: watchdog pipe: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", append([]string{"-c", watchdogScript, data}, children...)...)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("kubeenv: start watchdog: %w", err)
	}
	return &watchdog{w: w, cmd: cmd}, nil
}

// close releases the watchdog after a normal stop.
func (d *watchdog) close() {
	d.w.Close()
	_ = d.cmd.Wait()
}

// childrenRunning returns "pid:path" for each child of this process whose
// executable is one of paths.
func childrenRunning(paths []string) ([]string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		fields := strings.Fields(rest)
		if len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid != self {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil {
			continue
		}
		for _, p := range paths {
			if exe == p {
				out = append(out, strconv.Itoa(pid)+":"+p)
			}
		}
	}
	return out, nil
}
