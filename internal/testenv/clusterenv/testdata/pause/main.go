// Command pause is the Pod sandbox's process in clusterenv's node (the
// kubelet's "pause image", built locally: there is no registry to pull
// registry.k8s.io/pause from). It sleeps until SIGTERM or SIGINT and reaps
// any child reparented to it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
