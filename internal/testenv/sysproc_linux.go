package testenv

import "syscall"

// sysProcAttr puts a peer in its own process group and has the kernel kill it
// when the thread that started it dies (see StartProcess).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
