// Command pause is the process of the pod sandbox ("infra") container of the
// kubelet end-to-end tests: the image fusiond.test/pause:1 that containerd's
// CRI plugin starts for every pod (its sandbox_image). No registry is
// reachable from CI, so the usual registry.k8s.io/pause cannot be pulled;
// build.sh builds this one, statically (CGO_ENABLED=0), and mkimage packs
// it into an image archive.
//
// Like the usual pause program it does nothing but hold the pod's
// namespaces: it waits for SIGTERM or SIGINT and exits 0. As PID 1 of a
// PID namespace shared by the pod's containers it also reaps orphaned
// children, which would otherwise stay zombies.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited, without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
