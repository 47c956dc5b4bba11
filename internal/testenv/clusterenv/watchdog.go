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
// never were the machine's), each node's cgroupRoot's folders, the
// cluster's folder and, if no other cluster runs, the sysctls the kubelets
// changed (machine: recorded by the first cluster to start).
//
// It is a shell in its own process group, blocked reading a pipe whose only
// writer is the test process. Stop writes a line: the shell exits and does
// nothing. If the test process dies instead, the read ends without a line
// and the shell removes the veths and the cgroups (retrying while the last
// processes leave) and the cluster's folder, then takes the last turn as
// hold.release does: under the machine's mutex it lets go of its shared
// flock on LockFile (fd 4) and, if no other cluster holds one, writes the
// record back and removes it. Its slot (fd 3) is free when it exits.
type watchdog struct {
	w   *os.File
	cmd *exec.Cmd
}

const watchdogScript = `
if read -r _; then exit 0; fi
dir=$1 hostifs=$2 cgs=$3 mutex=$4 lock=$5 record=$6 procsys=$7
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
case "$dir" in */gdr-cluster-*) rm -rf -- "$dir" ;; esac
exec 5>"$mutex"
flock 5
exec 4>&-
if flock -xn "$lock" true; then
  while IFS='=' read -r k v; do printf '%s\n' "$v" >"$procsys/$k"; done <"$record"
  rm -f -- "$record"
fi
`

// startWatchdog watches for c's test process to go without Stop.
func startWatchdog(c *Cluster) (*watchdog, error) {
	var hostIfs, cgroupDirs []string
	for _, n := range c.nodes {
		hostIfs, cgroupDirs = append(hostIfs, n.hostIf), append(cgroupDirs, n.cgroupDir)
	}
	return watch(c.hold, c.Dir, hostIfs, cgroupDirs)
}

// watch starts the watchdog of the cluster in dir that holds h.
func watch(h *hold, dir string, hostIfs, cgroupDirs []string) (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("watchdog pipe: %w", err)
	}
	defer r.Close()
	m := h.m
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "clusterenv-watchdog", dir,
		strings.Join(hostIfs, " "), strings.Join(cgroupDirs, " "),
		m.path("mutex"), m.path("lock"), m.path("sysctls"), m.procSys)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The slot and the shared flock on LockFile (fd 3 and 4) stay held
	// until the watchdog too has closed them: no next cluster takes the
	// slot's addresses before its veths are gone, and no cluster is taken
	// for the last while this one's leftovers remain.
	cmd.ExtraFiles = h.files()
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
