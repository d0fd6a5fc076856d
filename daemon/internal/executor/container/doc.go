// Package container runs fusiond's container jobs (a job spec with
// rootfs:) through runc's libcontainer: the job's first process gets its own
// mount, pid, uts, ipc and cgroup namespaces over the given root filesystem
// (host network), joins the cgroup the job's monitor created with the job's
// limits, has only the default and granted device nodes in its /dev, and runs
// as the submitting user with no new privileges.
//
// libcontainer starts containers by re-executing the binary with "init";
// the binary must call Init first thing in main, and this package imports
// libcontainer's nsenter (cgo), whose constructor runs before the Go runtime
// in that re-executed process.
//
// Without cgo (CGO_ENABLED=0) the package holds only BuildBusyboxRootfs and
// a fusiond built that way refuses container jobs.
//
// It may import daemon/internal/executor (the runtime interface it
// implements), cgroups/devicefilter, devices, libcontainer and the
// standard library.
package container
