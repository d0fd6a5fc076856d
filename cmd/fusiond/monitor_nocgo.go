//go:build !cgo

package main

import (
	"os"

	"github.com/fusiond/fusiond/daemon/exec"
)

// hiddenMode runs the modes fusiond re-executes itself in (a job's
// monitor, a job's first process) and exits; it returns for a normal start.
// Built without cgo, fusiond has no container runtime.
func hiddenMode() {
	if code, ok := exec.Dispatch(os.Args); ok {
		os.Exit(code)
	}
}
