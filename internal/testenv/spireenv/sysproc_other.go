//go:build !linux

package spireenv

import "syscall"

// sysProcAttr sets nothing: without a parent-death signal a killed test
// binary can leave the server running (stop it by its full path).
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
