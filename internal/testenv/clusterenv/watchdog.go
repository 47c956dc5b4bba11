package clusterenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// watchdog undoes what the nodes leave on the machine once the test binary
// is gone without Stop (a timeout panic, a kill). The nodes' processes need
// no watchdog: the parent-death signal kills each unshare, whose
// --kill-child kills its namespace's init, which ends the whole PID
// namespace. What is left is each node's veth to the machine (until the
// kernel destroys it with the network namespace; the links between nodes
// never were the machine's), each node's cgroupRoot's folders, the sysctls
// the kubelets changed (recorded once, before the first node) and the
// cluster's folder.
//
// It is a shell in its own process group, blocked reading a pipe whose only
// writer is the test process. Stop writes a line: the shell exits and does
// nothing. If the test process dies instead, the read ends without a line
// and the shell removes the veths and the cgroups (retrying while the last
// processes leave), writes the recorded sysctls back and removes the
// cluster's folder.
type watchdog struct {
	w   *os.File
	cmd *exec.Cmd
}

const watchdogScript = `
if read -r _; then exit 0; fi
dir=$1 hostifs=$2 cgs=$3; shift 3
sleep 1
for hostif in $hostifs; do ip link del "$hostif" 2>/dev/null; done
for try in 1 2 3 4 5 6 7 8 9 10; do
  left=
  for cg in $cgs; do
    for h in /sys/fs/cgroup/*; do
      [ -d "$h$cg" ] || continue
      find "$h$cg" -depth -type d -exec rmdir {} \; 2>/dev/null
      [ -d "$h$cg" ] && left=1
    done
  done
  [ -z "$left" ] && break
  sleep 1
done
for kv in "$@"; do
  printf '%s\n' "${kv#*=}" >"/proc/sys/${kv%%=*}"
done
case "$dir" in */gdr-cluster-*) rm -rf -- "$dir" ;; esac
`

// startWatchdog watches for c's test process to go without Stop.
func startWatchdog(c *Cluster) (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("watchdog pipe: %w", err)
	}
	defer r.Close()
	var hostIfs, cgroupDirs []string
	for _, n := range c.nodes {
		hostIfs, cgroupDirs = append(hostIfs, n.hostIf), append(cgroupDirs, n.cgroupDir)
	}
	args := []string{"-c", watchdogScript, "clusterenv-watchdog", c.Dir, strings.Join(hostIfs, " "), strings.Join(cgroupDirs, " ")}
	for s, v := range c.sysctls {
		args = append(args, s+"="+v)
	}
	cmd := exec.Command("/bin/sh", args...)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The machine lock's file: the lock stays held until the watchdog too
	// has closed it, so no next cluster records the sysctls before they are
	// restored.
	cmd.ExtraFiles = []*os.File{c.lock}
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
