// Command peakrss runs a program and prints its wall time and peak RSS
// (test only: the measuring end of handle's cold-start benchmark).
//
//	peakrss <program> [args...]
//
// It runs program with this process's environment, its standard output and
// error going to this process's standard error, and once it exited 0 prints
// one line on standard output: "<exec -> exit in ns> <peak RSS in KiB>".
// It exits 1 when program could not run or did not exit 0.
//
// Why a program of its own: Go starts a child with vfork (CLONE_VM), and
// Linux charges the address space a process leaves at exec to its peak RSS,
// so a child of the benchmark process reports at least the benchmark's own
// RSS (an embedded NATS server, tens of MiB). Started from this small
// process, program's peak RSS is its own, with this process's few MiB as the
// floor.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peakrss <program> [args...]")
		os.Exit(1)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)
	if err != nil {
		fmt.Fprintf(os.Stderr, "peakrss: %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		fmt.Fprintln(os.Stderr, "peakrss: no resource usage on this platform")
		os.Exit(1)
	}
	fmt.Printf("%d %d\n", elapsed.Nanoseconds(), ru.Maxrss) // Maxrss: KiB on Linux
}
