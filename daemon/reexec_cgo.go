//go:build cgo

package daemon

import (
	"github.com/fusiond/fusiond/daemon/internal/executor"
	"github.com/fusiond/fusiond/daemon/internal/executor/container"
)

// Reexec runs the modes fusiond re-executes itself in — libcontainer's
// container init, a job's monitor, a job's first process — and reports
// their exit code; ok is false for a normal start (args are os.Args).
func Reexec(args []string) (code int, ok bool) {
	container.Init(args)
	return executor.DispatchWith(args, container.Runtime{})
}
