package executor

import (
	"os"
	"syscall"

	"github.com/fusiond/fusiond/cgroups"
)

// ContainerRuntime starts a job's process in a container: its own mount,
// pid, uts, ipc and cgroup namespaces over the job's root filesystem, in the
// job's (already created) cgroup. Package daemon/internal/executor/container implements
// it with runc's libcontainer; it lives apart because libcontainer needs cgo
// and a re-exec hook of its own in main.
type ContainerRuntime interface {
	Start(req ContainerRequest) (JobProcess, error)
}

// ContainerRequest is one container job for a ContainerRuntime.
type ContainerRequest struct {
	Spec Spec
	// StateDir is where the runtime may keep its state (in the attempt
	// directory).
	StateDir string
	// CgroupPath is the job's cgroup relative to the mount root; Limits
	// are what was applied there (the runtime re-states the device rules,
	// which libcontainer insists on writing itself).
	CgroupPath string
	Limits     cgroups.Limits
	// Output receives the container's stdout and stderr.
	Output *os.File
	// Root is Spec.Rootfs as the job's user opened it (see
	// ContainerMountPoints for what was checked inside it), and RootPath
	// the path it really is. The runtime starts the container over
	// RootPath and refuses to let it run unless its root is Root.
	Root     *os.File
	RootPath string
}

// JobProcess is a job's first process as its monitor sees it.
type JobProcess interface {
	Pid() int
	// Wait waits for it to end.
	Wait() (syscall.WaitStatus, error)
	// Close releases what the process held (a container's state) once it
	// has ended and its cgroup has been emptied.
	Close() error
}
