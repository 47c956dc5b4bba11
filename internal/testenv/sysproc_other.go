//go:build !linux

package testenv

import "syscall"

// sysProcAttr puts a peer in its own process group. Without a parent-death
// signal a killed test binary can leave the peer running (stop it by its full
// path).
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
