//go:build cgo

package main

import (
	"os"

	"github.com/fusiond/fusiond/daemon/exec"
	"github.com/fusiond/fusiond/daemon/exec/container"
)

// hiddenMode runs the modes fusiond re-executes itself in (libcontainer's
// container init, a job's monitor, a job's first process) and exits; it
// returns for a normal start.
func hiddenMode() {
	container.Init(os.Args)
	if code, ok := exec.DispatchWith(os.Args, container.Runtime{}); ok {
		os.Exit(code)
	}
}
