package spireenv

import "syscall"

// sysProcAttr puts the server in its own process group and has the kernel
// kill it when the thread that started it dies (see process).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
