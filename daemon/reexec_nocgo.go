//go:build !cgo

package daemon

import "github.com/fusiond/fusiond/daemon/internal/executor"

// Reexec runs the modes fusiond re-executes itself in — a job's monitor, a
// job's first process — and reports their exit code; ok is false for a
// normal start (args are os.Args). Built without cgo, fusiond has no
// container runtime.
func Reexec(args []string) (code int, ok bool) {
	return executor.Dispatch(args)
}
