package jobs

import (
	"context"
	"syscall"

	"github.com/fusiond/fusiond/daemon/api"
)

// RunRequest is everything a Runner needs to start one attempt of a job.
type RunRequest struct {
	JobID   string
	Attempt int
	Command []string
	// Env is the complete environment, KEY=value.
	Env     []string
	Workdir string
	UID     uint32
	GID     uint32
	Groups  []uint32
	// LogPath receives the job's stdout and stderr.
	LogPath    string
	Tier       api.Tier
	Allocation api.Allocation
}

// Process is a started job.
type Process interface {
	PID() int
	// Wait blocks until the job's process ends.
	Wait() (api.ExitStatus, error)
	// Signal sends sig to every process of the job.
	Signal(sig syscall.Signal) error
}

// Runner starts jobs. The plain-process runner in daemon/exec is one.
type Runner interface {
	Start(ctx context.Context, req RunRequest) (Process, error)
	// Reap kills whatever is left of a job attempt that was running when
	// the daemon stopped (pid is its recorded leader, or 0 if none was
	// recorded), and says how many processes it killed.
	Reap(jobID string, pid int) (int, error)
}

// Placer reserves host resources for jobs. The manager calls it from one
// goroutine at a time.
type Placer interface {
	// Admit rejects a spec this host can never satisfy, with an *api.Error
	// (code unsatisfiable) naming the field.
	Admit(spec api.JobSpec) error
	// Place reserves resources for every job in group (a single job, or all
	// members of a gang) or for none. When it cannot, it says why in words
	// a user can read.
	Place(group []*api.Job) ([]api.Allocation, string, bool)
	// Release returns a job's reservation.
	Release(job *api.Job)
	// Capacity and Allocated report the host's totals.
	Capacity() api.NodeResources
	Allocated() api.NodeResources
}
